package dev.deepspan.otel;

import io.opentelemetry.context.Context;
import io.opentelemetry.sdk.trace.ReadWriteSpan;
import io.opentelemetry.sdk.trace.ReadableSpan;
import io.opentelemetry.sdk.trace.internal.ExtendedSpanProcessor;

/**
 * Puts {@code deepspan.tid} and {@code deepspan.mono_start_ns} on every span at its start, and
 * {@code deepspan.mono_end_ns} at its end. No system call: the tid is cached per thread and
 * System.nanoTime is CLOCK_MONOTONIC read through the vDSO.
 *
 * <p>The end time is written in {@code onEnding}, while the span can still take attributes ({@link
 * ExtendedSpanProcessor}: the SDK's hook for that, marked internal but kept since SDK 1.37).
 */
public final class DeepspanSpanProcessor implements ExtendedSpanProcessor {
  @Override
  public void onStart(Context parentContext, ReadWriteSpan span) {
    long mono = System.nanoTime();
    span.setAttribute(DeepspanAttributes.TID, DeepspanThread.current().tid);
    if (DeepspanThread.PID_NAMESPACE != null) {
      span.setAttribute(DeepspanAttributes.PID_NS, DeepspanThread.PID_NAMESPACE);
    }
    span.setAttribute(DeepspanAttributes.MONO_START, mono);
  }

  @Override
  public boolean isStartRequired() {
    return true;
  }

  @Override
  public void onEnding(ReadWriteSpan span) {
    span.setAttribute(DeepspanAttributes.MONO_END, System.nanoTime());
  }

  @Override
  public boolean isOnEndingRequired() {
    return true;
  }

  @Override
  public void onEnd(ReadableSpan span) {}

  @Override
  public boolean isEndRequired() {
    return false;
  }
}
