package dev.tablecast.peers;

import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import java.io.IOException;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;

/** The JDK's com.sun.net.httpserver with a fixed pool of request threads. */
final class JdkFront implements HttpFront {
  private HttpServer server;
  private ExecutorService pool;

  @Override
  public void start(InteractiveQueries.Config config, Router router) throws IOException {
    server = HttpServer.create(new InetSocketAddress(config.bind(), config.port()), 1024);
    pool = Executors.newFixedThreadPool(config.httpThreads());
    server.setExecutor(pool);
    server.createContext("/", ex -> answer(ex, router));
    server.start();
  }

  private static void answer(HttpExchange ex, Router router) throws IOException {
    boolean forwarded = ex.getRequestHeaders().containsKey(InteractiveQueries.FORWARDED);
    // a request thread waits for a forward: this server has no other way
    InteractiveQueries.Reply reply =
        router.route(ex.getRequestMethod(), ex.getRequestURI().getRawPath(), forwarded).join();
    ex.getResponseHeaders().set("Content-Type", "application/json");
    if (reply.servedBy() != null) {
      ex.getResponseHeaders().set(InteractiveQueries.SERVED_BY, reply.servedBy());
    }
    ex.sendResponseHeaders(reply.status(), reply.body().length);
    try (OutputStream out = ex.getResponseBody()) {
      out.write(reply.body());
    }
  }

  @Override
  public void stop() {
    server.stop(0);
    pool.shutdownNow();
  }
}
