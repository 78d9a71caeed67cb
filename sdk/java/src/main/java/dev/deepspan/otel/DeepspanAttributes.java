package dev.deepspan.otel;

import io.opentelemetry.api.common.AttributeKey;

/** The names deepspan reads, the same as sdk/python's {@code deepspan_otel}. */
public final class DeepspanAttributes {
  /** The OS thread id (kernel tid) of the thread that started the span, or of an activation. */
  public static final AttributeKey<Long> TID = AttributeKey.longKey("deepspan.tid");
  /**
   * The inode number of the process's PID namespace, only when it is not the host's (a
   * container's own): the thread ids are then that namespace's, which deepspan maps to the
   * kernel's.
   */
  public static final AttributeKey<Long> PID_NS = AttributeKey.longKey("deepspan.pid_ns");
  /** CLOCK_MONOTONIC (System.nanoTime on Linux) at the span's start. */
  public static final AttributeKey<Long> MONO_START = AttributeKey.longKey("deepspan.mono_start_ns");
  /** CLOCK_MONOTONIC at the span's end. */
  public static final AttributeKey<Long> MONO_END = AttributeKey.longKey("deepspan.mono_end_ns");
  /** CLOCK_MONOTONIC of an activation event. */
  public static final AttributeKey<Long> MONO_NS = AttributeKey.longKey("deepspan.mono_ns");
  /** The span became the current span of a thread. */
  public static final String EVENT_ON = "deepspan.on";
  /** The span stopped being the current span of a thread. */
  public static final String EVENT_OFF = "deepspan.off";

  private DeepspanAttributes() {}
}
