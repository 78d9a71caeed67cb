package dev.deepspan.otel;

import io.opentelemetry.api.trace.Span;
import io.opentelemetry.context.Context;
import io.opentelemetry.context.ContextStorage;
import io.opentelemetry.context.Scope;
import io.opentelemetry.sdk.trace.ReadWriteSpan;

/**
 * A context storage wrapper that sees every context attach and scope close, and so every time a
 * span becomes, or stops being, the current span of a thread: the agent's executor
 * instrumentation attaches the submitting thread's context in the pool thread, so a request handed
 * from thread to thread is followed ({@code deepspan.on}/{@code deepspan.off} events on its spans).
 */
public final class DeepspanContextStorage implements ContextStorage {
  private final ContextStorage delegate;

  public DeepspanContextStorage(ContextStorage delegate) {
    this.delegate = delegate;
  }

  @Override
  public Scope attach(Context toAttach) {
    Scope scope = delegate.attach(toAttach);
    if (scope == Scope.noop()) {
      return scope; // already current: nothing changes
    }
    switchTo(toAttach);
    return () -> {
      scope.close();
      switchTo(delegate.current());
    };
  }

  @Override
  public Context current() {
    return delegate.current();
  }

  @Override
  public Context root() {
    return delegate.root();
  }

  private static void switchTo(Context context) {
    try {
      DeepspanThread.current().switchTo(spanOf(context));
    } catch (RuntimeException e) {
      // Never break the application's context handling.
    }
  }

  /** The SDK span current in a context, or null (none, or a span not recorded by this SDK). */
  static ReadWriteSpan spanOf(Context context) {
    if (context == null) {
      return null;
    }
    Span span = Span.fromContextOrNull(context);
    return span instanceof ReadWriteSpan ? (ReadWriteSpan) span : null;
  }
}
