/** Span attributes that deepspan reads (see index.js). */
export declare const ATTR_TID: 'deepspan.tid';
export declare const ATTR_PID_NS: 'deepspan.pid_ns';
export declare const ATTR_MONO_START: 'deepspan.mono_start_ns';
export declare const ATTR_MONO_END: 'deepspan.mono_end_ns';

/**
 * Stores the thread id and CLOCK_MONOTONIC start and end of every span.
 * Duck-typed against the SDK's SpanProcessor interface: it works with
 * @opentelemetry/sdk-trace-base 1.x and 2.x and @opentelemetry/sdk-trace 3.
 */
export declare class DeepspanSpanProcessor {
  onStart(span: { setAttribute(key: string, value: number): unknown }, parentContext?: unknown): void;
  onEnding(span: { setAttribute(key: string, value: number): unknown }): void;
  onEnd(span: { attributes?: Record<string, unknown> }): void;
  forceFlush(): Promise<void>;
  shutdown(): Promise<void>;
}
