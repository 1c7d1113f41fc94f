package dev.tablecast.peers;

import java.nio.ByteBuffer;
import org.eclipse.jetty.http.HttpHeader;
import org.eclipse.jetty.http.UriCompliance;
import org.eclipse.jetty.server.Handler;
import org.eclipse.jetty.server.HttpConfiguration;
import org.eclipse.jetty.server.HttpConnectionFactory;
import org.eclipse.jetty.server.Request;
import org.eclipse.jetty.server.Response;
import org.eclipse.jetty.server.Server;
import org.eclipse.jetty.server.ServerConnector;
import org.eclipse.jetty.util.Callback;
import org.eclipse.jetty.util.thread.QueuedThreadPool;

/**
 * Jetty 12 with a core (non-servlet) handler: the request completes when the answer is there, so a
 * forward holds no thread. The pool's maximum is --http-threads (Jetty's default is 200).
 */
final class JettyFront implements HttpFront {
  private Server server;

  @Override
  public void start(InteractiveQueries.Config config, Router router) throws Exception {
    QueuedThreadPool pool = new QueuedThreadPool(config.httpThreads());
    pool.setName("jetty");
    server = new Server(pool);
    HttpConfiguration http = new HttpConfiguration();
    // keys may hold an encoded '/' (%2F), which Jetty 12 refuses as ambiguous by default
    http.setUriCompliance(UriCompliance.LEGACY);
    http.setSendServerVersion(false);
    ServerConnector connector = new ServerConnector(server, new HttpConnectionFactory(http));
    connector.setHost(config.bind());
    connector.setPort(config.port());
    connector.setAcceptQueueSize(1024);
    server.addConnector(connector);
    server.setHandler(
        new Handler.Abstract.NonBlocking() {
          @Override
          public boolean handle(Request request, Response response, Callback callback) {
            boolean forwarded = request.getHeaders().contains(InteractiveQueries.FORWARDED);
            router
                .route(request.getMethod(), request.getHttpURI().getPath(), forwarded)
                .whenComplete(
                    (reply, error) -> {
                      if (error != null) {
                        callback.failed(error);
                        return;
                      }
                      response.setStatus(reply.status());
                      response.getHeaders().put(HttpHeader.CONTENT_TYPE, "application/json");
                      if (reply.servedBy() != null) {
                        response.getHeaders().put(InteractiveQueries.SERVED_BY, reply.servedBy());
                      }
                      response.write(true, ByteBuffer.wrap(reply.body()), callback);
                    });
            return true;
          }
        });
    server.start();
  }

  @Override
  public void stop() {
    try {
      server.stop();
    } catch (Exception e) {
      throw new IllegalStateException(e);
    }
  }
}
