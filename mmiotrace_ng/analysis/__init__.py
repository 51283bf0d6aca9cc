"""The tools that turn a trace into an answer: reading traces, diff,
annotate with register maps, export, plot."""
