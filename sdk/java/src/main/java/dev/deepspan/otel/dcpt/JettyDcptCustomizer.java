package dev.deepspan.otel.dcpt;

import io.opentelemetry.javaagent.bootstrap.http.HttpServerResponseCustomizer;
import io.opentelemetry.javaagent.bootstrap.http.HttpServerResponseMutator;
import io.opentelemetry.javaagent.shaded.io.opentelemetry.api.trace.Span;
import io.opentelemetry.javaagent.shaded.io.opentelemetry.context.Context;
import java.lang.reflect.InvocationHandler;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.lang.reflect.Proxy;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.logging.Level;
import java.util.logging.Logger;

/**
 * DCPT for Jetty 9.4 to 11 (WireMock, Spring Boot's and Dropwizard's Jetty, …): a request whose
 * caller sent {@code deepspan-dcpt: 1} answers with its hop in {@code deepspan-dcpt-path}.
 *
 * <p>Why this way: the agent calls a response customizer when the server span starts, before the
 * request has run, and its extensions cannot rewrite classes without the agent's build plugins.
 * So at the span's start this puts a hook in front of Jetty's response output ({@code
 * HttpOutput.Interceptor}, the chain Jetty's own GzipHandler uses): Jetty commits the reply
 * headers at the first write that reaches the channel, and every write passes the hook first.
 * There, with the request's time and calls known, it adds the header. Jetty's classes live in the
 * application's class loader, so the hook is a {@link Proxy} of Jetty's interface, reached by
 * reflection; Jetty resets the chain for each request. Jetty 12 has no such chain and is left
 * alone, as is any other server: no header, nothing else changes.
 *
 * <p>Cost for a request that did not ask: one header lookup.
 */
public final class JettyDcptCustomizer implements HttpServerResponseCustomizer {
  private static final Logger LOG = Logger.getLogger(JettyDcptCustomizer.class.getName());
  /** Jetty's methods by response class; null for a class that is not a Jetty 9.4-11 response. */
  private static final ClassValue<Jetty> JETTY =
      new ClassValue<Jetty>() {
        @Override
        protected Jetty computeValue(Class<?> type) {
          return Jetty.of(type);
        }
      };
  /** A servlet wrapper's {@code getResponse} by class; null for a class that has none. */
  private static final ClassValue<Method> WRAPPED =
      new ClassValue<Method>() {
        @Override
        protected Method computeValue(Class<?> type) {
          try {
            return type.getMethod("getResponse");
          } catch (NoSuchMethodException e) {
            return null;
          }
        }
      };

  @Override
  public <RESPONSE> void customize(
      Context serverContext, RESPONSE response, HttpServerResponseMutator<RESPONSE> mutator) {
    try {
      install(serverContext, response);
    } catch (ReflectiveOperationException | RuntimeException e) {
      LOG.log(Level.FINE, "no in-band path for this response", e);
    }
  }

  private static void install(Context serverContext, Object response)
      throws ReflectiveOperationException {
    Object jettyResponse = response;
    Jetty jetty = JETTY.get(jettyResponse.getClass());
    // Servlet wrappers, down to Jetty's own response.
    for (int depth = 0; jetty == null && depth < 8; depth++) {
      Method inner = WRAPPED.get(jettyResponse.getClass());
      if (inner == null) {
        return;
      }
      jettyResponse = inner.invoke(jettyResponse);
      if (jettyResponse == null) {
        return;
      }
      jetty = JETTY.get(jettyResponse.getClass());
    }
    if (jetty == null) {
      return;
    }
    Object request = jetty.getRequest.invoke(jetty.getHttpChannel.invoke(jettyResponse));
    if (!"1".equals(jetty.getHeader.invoke(request, DcptPath.REQUEST_HEADER))) {
      return;
    }
    Object output = jetty.getHttpOutput.invoke(jettyResponse);
    Object next = jetty.getInterceptor.invoke(output);
    // The agent may call customizers twice for one request (server and servlet instrumentation).
    if (Proxy.isProxyClass(next.getClass())
        && Proxy.getInvocationHandler(next) instanceof CommitHook) {
      return;
    }
    String traceId = Span.fromContext(serverContext).getSpanContext().getTraceId();
    String operation = jetty.getMethod.invoke(request) + " " + jetty.getRequestURI.invoke(request);
    DcptRequests.Open open = DcptRequests.open(traceId, operation, System.nanoTime());
    Object hook =
        Proxy.newProxyInstance(
            jetty.interceptor.getClassLoader(),
            new Class<?>[] {jetty.interceptor},
            new CommitHook(jetty, jettyResponse, next, open));
    jetty.setInterceptor.invoke(output, hook);
  }

  /** The Jetty methods the hook calls, found once per response class. */
  private static final class Jetty {
    final Method getHttpChannel;
    final Method getRequest;
    final Method getHeader;
    final Method getMethod;
    final Method getRequestURI;
    final Method getHttpOutput;
    final Method getInterceptor;
    final Method setInterceptor;
    final Method setHeader;
    final Method isCommitted;
    final Class<?> interceptor;

    private Jetty(Class<?> response, Class<?> channel, Class<?> request, Class<?> output)
        throws ReflectiveOperationException {
      ClassLoader loader = response.getClassLoader();
      interceptor = Class.forName("org.eclipse.jetty.server.HttpOutput$Interceptor", false, loader);
      getHttpChannel = response.getMethod("getHttpChannel");
      getRequest = channel.getMethod("getRequest");
      getHeader = request.getMethod("getHeader", String.class);
      getMethod = request.getMethod("getMethod");
      getRequestURI = request.getMethod("getRequestURI");
      getHttpOutput = response.getMethod("getHttpOutput");
      getInterceptor = output.getMethod("getInterceptor");
      setInterceptor = output.getMethod("setInterceptor", interceptor);
      setHeader = response.getMethod("setHeader", String.class, String.class);
      isCommitted = response.getMethod("isCommitted");
    }

    static Jetty of(Class<?> type) {
      for (Class<?> c = type; c != null; c = c.getSuperclass()) {
        if (!c.getName().equals("org.eclipse.jetty.server.Response")) {
          continue;
        }
        try {
          ClassLoader loader = c.getClassLoader();
          return new Jetty(
              c,
              Class.forName("org.eclipse.jetty.server.HttpChannel", false, loader),
              Class.forName("org.eclipse.jetty.server.Request", false, loader),
              Class.forName("org.eclipse.jetty.server.HttpOutput", false, loader));
        } catch (ReflectiveOperationException | LinkageError e) {
          // Jetty 12 (another Response), or a Jetty without the interceptor chain.
          return null;
        }
      }
      return null;
    }
  }

  /**
   * Jetty's output interceptor in front of the one that was there: the first write adds the
   * header while the response can still take it, then every call goes on to the next one.
   */
  private static final class CommitHook implements InvocationHandler {
    private final Jetty jetty;
    private final Object response;
    private final Object next;
    private final DcptRequests.Open open;
    private final AtomicBoolean written = new AtomicBoolean();

    CommitHook(Jetty jetty, Object response, Object next, DcptRequests.Open open) {
      this.jetty = jetty;
      this.response = response;
      this.next = next;
      this.open = open;
    }

    @Override
    public Object invoke(Object proxy, Method method, Object[] args) throws Throwable {
      switch (method.getName()) {
        case "getNextInterceptor":
          return next;
        case "write":
          if (written.compareAndSet(false, true)) {
            String value = DcptRequests.close(open, System.nanoTime());
            if (!(Boolean) jetty.isCommitted.invoke(response)) {
              jetty.setHeader.invoke(response, DcptPath.REPLY_HEADER, value);
            }
          }
          break;
        case "hashCode":
          return System.identityHashCode(proxy);
        case "equals":
          return proxy == args[0];
        case "toString":
          return "deepspan DCPT hook before " + next;
        default:
          break;
      }
      try {
        return method.invoke(next, args);
      } catch (InvocationTargetException e) {
        throw e.getCause();
      }
    }
  }
}
