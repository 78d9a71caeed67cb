package dev.deepspan.otel;

import dev.deepspan.otel.dcpt.DcptRequests;
import io.opentelemetry.api.common.AttributeKey;
import io.opentelemetry.api.trace.SpanKind;
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
 *
 * <p>It also tells {@link DcptRequests} the service's name and the client calls that end while a
 * request's caller waits for its in-band path.
 */
public final class DeepspanSpanProcessor implements ExtendedSpanProcessor {
  private static final AttributeKey<String> SERVICE_NAME = AttributeKey.stringKey("service.name");
  private static final AttributeKey<String> SERVER_ADDRESS =
      AttributeKey.stringKey("server.address");
  private static final AttributeKey<Long> SERVER_PORT = AttributeKey.longKey("server.port");
  private static final AttributeKey<String> URL_FULL = AttributeKey.stringKey("url.full");
  private static final AttributeKey<String> METHOD = AttributeKey.stringKey("http.request.method");

  private volatile boolean named;

  @Override
  public void onStart(Context parentContext, ReadWriteSpan span) {
    long mono = System.nanoTime();
    if (!named) {
      named = true;
      DcptRequests.serviceName(span.toSpanData().getResource().getAttribute(SERVICE_NAME));
    }
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
  public void onEnd(ReadableSpan span) {
    if (!DcptRequests.any() || span.getKind() != SpanKind.CLIENT) {
      return;
    }
    Long start = span.getAttribute(DeepspanAttributes.MONO_START);
    Long end = span.getAttribute(DeepspanAttributes.MONO_END);
    if (start == null || end == null) {
      return;
    }
    // Named as the Python side names a callee that answered without a path: host:port and
    // "METHOD /path".
    String url = span.getAttribute(URL_FULL);
    java.net.URI uri = null;
    try {
      uri = url == null ? null : java.net.URI.create(url);
    } catch (IllegalArgumentException e) {
      // An instrumentation's URL that java.net.URI does not take: named by the attributes alone.
    }
    String host = span.getAttribute(SERVER_ADDRESS);
    Long port = span.getAttribute(SERVER_PORT);
    String callee =
        host != null
            ? (port != null ? host + ":" + port : host)
            : (uri != null && uri.getRawAuthority() != null ? uri.getRawAuthority() : span.getName());
    String method = span.getAttribute(METHOD);
    String operation =
        method != null && uri != null && uri.getRawPath() != null
            ? method + " " + (uri.getRawPath().isEmpty() ? "/" : uri.getRawPath())
            : span.getName();
    DcptRequests.callEnded(
        span.getSpanContext().getTraceId(), start, end, callee, operation);
  }

  @Override
  public boolean isEndRequired() {
    return true;
  }
}
