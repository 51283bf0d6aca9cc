"""mmiotrace-ng replay: a recorded driver sequence played back to a device
from user space, reads checked and polls waited for (device.py: the device's
BARs; plan.py: the trace made into the accesses to make; player.py: making
them; command.py: the command line)."""
