package dev.tablecast.peers;

import java.util.concurrent.CompletableFuture;

/**
 * The HTTP server in front of the interactive queries. The benchmark compares tablecast with the
 * stacks the seeds would deploy: the JDK's server, Jetty (seed 001) and Reactor Netty (seed 000's
 * Spring reactive web runs on it).
 */
interface HttpFront {
  /** method, raw path (still percent-encoded), whether the request is a forward -> the answer. */
  interface Router {
    CompletableFuture<InteractiveQueries.Reply> route(
        String method, String rawPath, boolean forwarded);
  }

  void start(InteractiveQueries.Config config, Router router) throws Exception;

  void stop();

  static HttpFront of(String name) {
    return switch (name) {
      case "jdk" -> new JdkFront();
      case "jetty" -> new JettyFront();
      case "netty" -> new NettyFront();
      default -> throw new IllegalArgumentException("--http must be jdk, jetty or netty: " + name);
    };
  }
}
