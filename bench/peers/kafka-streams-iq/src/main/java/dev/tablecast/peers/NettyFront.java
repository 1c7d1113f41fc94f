package dev.tablecast.peers;

import io.netty.buffer.Unpooled;
import io.netty.handler.codec.http.HttpHeaderNames;
import io.netty.handler.codec.http.HttpResponseStatus;
import reactor.core.publisher.Mono;
import reactor.netty.DisposableServer;
import reactor.netty.http.server.HttpServer;

/**
 * Reactor Netty, the server under Spring's reactive web (seed 000): the store read runs on the
 * event loop, as a WebFlux handler calling the store would, and a forward completes without
 * blocking it.
 */
final class NettyFront implements HttpFront {
  private DisposableServer server;

  @Override
  public void start(InteractiveQueries.Config config, Router router) {
    server =
        HttpServer.create()
            .host(config.bind())
            .port(config.port())
            .handle(
                (request, response) -> {
                  boolean forwarded =
                      request.requestHeaders().contains(InteractiveQueries.FORWARDED);
                  String path = request.uri();
                  int query = path.indexOf('?');
                  String rawPath = query < 0 ? path : path.substring(0, query);
                  return Mono.fromFuture(router.route(request.method().name(), rawPath, forwarded))
                      .flatMap(
                          reply -> {
                            response
                                .status(HttpResponseStatus.valueOf(reply.status()))
                                .header(HttpHeaderNames.CONTENT_TYPE, "application/json");
                            if (reply.servedBy() != null) {
                              response.header(InteractiveQueries.SERVED_BY, reply.servedBy());
                            }
                            return response
                                .send(Mono.just(Unpooled.wrappedBuffer(reply.body())))
                                .then();
                          });
                })
            .bindNow();
  }

  @Override
  public void stop() {
    server.disposeNow();
  }
}
