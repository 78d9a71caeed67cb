/*
 * LTTng-UST tracepoint provider `jaeger_ust`: one event at each span start
 * and end, in the format of Gelle et al. (Jaeger + LTTng), which
 * deepspan-ctf decodes into SpanSync.
 */
#undef TRACEPOINT_PROVIDER
#define TRACEPOINT_PROVIDER jaeger_ust

#undef TRACEPOINT_INCLUDE
#define TRACEPOINT_INCLUDE "./jaeger_ust_tp.h"

#if !defined(JAEGER_UST_TP_H) || defined(TRACEPOINT_HEADER_MULTI_READ)
#define JAEGER_UST_TP_H

#include <stdint.h>
#include <lttng/tracepoint.h>

TRACEPOINT_EVENT(jaeger_ust, start_span,
	TP_ARGS(uint64_t, trace_id_high, uint64_t, trace_id_low, uint64_t, span_id,
		uint64_t, parent_span_id, const char *, op_name, uint64_t, start_time),
	TP_FIELDS(
		ctf_integer(uint64_t, trace_id_high, trace_id_high)
		ctf_integer(uint64_t, trace_id_low, trace_id_low)
		ctf_integer(uint64_t, span_id, span_id)
		ctf_integer(uint64_t, parent_span_id, parent_span_id)
		ctf_string(op_name, op_name)
		ctf_integer(uint64_t, start_time, start_time)
	)
)

TRACEPOINT_EVENT(jaeger_ust, end_span,
	TP_ARGS(uint64_t, trace_id_high, uint64_t, trace_id_low, uint64_t, span_id,
		uint64_t, duration),
	TP_FIELDS(
		ctf_integer(uint64_t, trace_id_high, trace_id_high)
		ctf_integer(uint64_t, trace_id_low, trace_id_low)
		ctf_integer(uint64_t, span_id, span_id)
		ctf_integer(uint64_t, duration, duration)
	)
)

#endif /* JAEGER_UST_TP_H */

#include <lttng/tracepoint-event.h>
