module tablecast.dev/bench/watch_h2

go 1.24
