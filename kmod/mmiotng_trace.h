/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The tracepoints of mmiotng (names in mmiotng_abi.h): the BPF side of
 * mmiotrace-ng attaches raw tracepoint programs to them; they also show
 * in tracefs as events/mmiotng/.
 */
#undef TRACE_SYSTEM
#define TRACE_SYSTEM mmiotng

#if !defined(MMIOTNG_TRACE_H) || defined(TRACE_HEADER_MULTI_READ)
#define MMIOTNG_TRACE_H

#include <linux/tracepoint.h>

#include "mmiotng_abi.h"

/*
 * mmiotng_access is a writable tracepoint: a BPF program of type
 * raw_tracepoint.w reads the record (its first argument, the buffer) with
 * plain loads, no probe read.  The BPF side only reads it.
 */
DECLARE_EVENT_CLASS(mmiotng_access_class,
		    TP_PROTO(const struct mmiotng_access *a),
		    TP_ARGS(a),
		    TP_STRUCT__entry(__field(u64, phys)
				     __field(u64, value)
				     __field(u64, ip)
				     __field(u8, width)
				     __field(u8, op)),
		    TP_fast_assign(__entry->phys = a->phys;
				   __entry->value = a->value;
				   __entry->ip = a->ip;
				   __entry->width = a->width;
				   __entry->op = a->op;),
		    TP_printk("%s %u 0x%llx 0x%llx ip=%pS",
			      __print_symbolic(__entry->op, { MMIOTNG_OP_READ, "R" },
					       { MMIOTNG_OP_WRITE, "W" },
					       { MMIOTNG_OP_UNKNOWN, "UNKNOWN" }),
			      __entry->width, __entry->phys, __entry->value,
			      (void *)__entry->ip)
);

/* only the BPF pass of the header knows writable events (as nbd's) */
#ifdef DEFINE_EVENT_WRITABLE
DEFINE_EVENT_WRITABLE(mmiotng_access_class, mmiotng_access,
		      TP_PROTO(const struct mmiotng_access *a),
		      TP_ARGS(a),
		      sizeof(struct mmiotng_access));
#else
DEFINE_EVENT(mmiotng_access_class, mmiotng_access,
	     TP_PROTO(const struct mmiotng_access *a),
	     TP_ARGS(a));
#endif

TRACE_EVENT(mmiotng_mark,
	    TP_PROTO(const char *text, u32 len),
	    TP_ARGS(text, len),
	    TP_STRUCT__entry(__field(u32, len)),
	    TP_fast_assign(__entry->len = len;),
	    TP_printk("len=%u", __entry->len)
);

TRACE_EVENT(mmiotng_map,
	    TP_PROTO(const struct mmiotng_map *m),
	    TP_ARGS(m),
	    TP_STRUCT__entry(__field(u64, virt)
			     __field(u64, phys)
			     __field(u64, size)
			     __field(s32, err)),
	    TP_fast_assign(__entry->virt = m->virt;
			   __entry->phys = m->phys;
			   __entry->size = m->size;
			   __entry->err = m->err;),
	    TP_printk("0x%llx 0x%llx 0x%llx err=%d", __entry->phys, __entry->size,
		      __entry->virt, __entry->err)
);

#endif /* MMIOTNG_TRACE_H */

#undef TRACE_INCLUDE_PATH
#define TRACE_INCLUDE_PATH .
#undef TRACE_INCLUDE_FILE
#define TRACE_INCLUDE_FILE mmiotng_trace
#include <trace/define_trace.h>
