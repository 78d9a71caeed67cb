/*
 * Emits nested jaeger_ust spans from two threads, with values the test can
 * predict: thread t (0 or 1), iteration i, depth d (0 root .. 2):
 *   trace_id = (0x1111 << 64) | (0x2222 + t), span_id = 1000 * (t + 1) + 10 * i + d,
 *   parent = previous depth's span (0 for the root), op_name = "op-t-d",
 *   start_time = 1600000000000000 + span_id, duration = 100 + span_id.
 * Usage: jaeger_ust [iterations]   (default 2). Prints "thread t tid X".
 */
#define TRACEPOINT_CREATE_PROBES
#define TRACEPOINT_DEFINE
#include "jaeger_ust_tp.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

static long iterations = 2;

static void *worker(void *arg)
{
	uint64_t t = (uint64_t) (uintptr_t) arg;
	char names[3][16];
	printf("thread %lu tid %ld\n", (unsigned long) t, (long) syscall(SYS_gettid));
	fflush(stdout);
	for (int d = 0; d < 3; d++)
		snprintf(names[d], sizeof(names[d]), "op-%lu-%d", (unsigned long) t, d);
	for (long i = 0; i < iterations; i++) {
		uint64_t ids[3];
		for (int d = 0; d < 3; d++) {
			ids[d] = 1000 * (t + 1) + 10 * (uint64_t) (i % 100) + (uint64_t) d;
			tracepoint(jaeger_ust, start_span, 0x1111, 0x2222 + t, ids[d],
				   d ? ids[d - 1] : 0, names[d], 1600000000000000ULL + ids[d]);
		}
		for (int d = 2; d >= 0; d--)
			tracepoint(jaeger_ust, end_span, 0x1111, 0x2222 + t, ids[d], 100 + ids[d]);
	}
	return NULL;
}

int main(int argc, char **argv)
{
	pthread_t threads[2];
	if (argc > 1)
		iterations = atol(argv[1]);
	for (uintptr_t t = 0; t < 2; t++)
		if (pthread_create(&threads[t], NULL, worker, (void *) t))
			return 1;
	for (int t = 0; t < 2; t++)
		pthread_join(threads[t], NULL);
	return 0;
}
