// One load process of `python -m bench watch --http2`: SSE watchers as HTTP/2 streams.
//
//	watch_h2 HOST PORT KEYS FIRST COUNT SECONDS STREAMS_PER_CONNECTION
//
// As bench/watch_load.c, but the watches share connections, STREAMS_PER_CONNECTION
// streams each (h2c, prior knowledge), as browsers' EventSource streams share one
// HTTP/2 connection and a proxy multiplexes its upstream: 20,000 watchers need
// 20,000 open files over HTTP/1.1, a hundred or two over HTTP/2. Prints
// {"ready": N, "seconds": S} once every watch had `ready`, then, on a line on
// stdin, measures for SECONDS and prints the latency histogram (0.1 ms buckets
// below 100 ms, 1 ms above), events, and streams the node ended.
package main

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

const (
	fineMs  = 100.0
	buckets = 1000 + 600000
)

var (
	hist      [buckets]int64
	events    int64
	ended     int64
	measuring atomic.Bool
	stamp     = []byte(`"t":`)
	readyMark = []byte("event: ready")
)

func bucket(seconds float64) int {
	ms := seconds * 1000
	var b int
	if ms < fineMs {
		if ms > 0 {
			b = int(ms * 10)
		}
	} else {
		b = int(fineMs*10) + int(ms-fineMs)
	}
	if b >= buckets {
		b = buckets - 1
	}
	return b
}

// scan counts the "t":<seconds>, stamps in buf and returns what may continue in the next read.
func scan(buf []byte, now float64) []byte {
	at, keep := 0, max(0, len(buf)-3)
	for {
		i := bytes.Index(buf[at:], stamp)
		if i < 0 {
			break
		}
		i += at
		j := bytes.IndexByte(buf[i+4:], ',')
		if j < 0 {
			keep = i
			break
		}
		j += i + 4
		if t, err := strconv.ParseFloat(string(buf[i+4:j]), 64); err == nil && measuring.Load() {
			atomic.AddInt64(&hist[bucket(now-t)], 1)
			atomic.AddInt64(&events, 1)
		}
		at = j
		keep = max(at, len(buf)-3)
	}
	return append([]byte(nil), buf[keep:]...)
}

func watch(client *http.Client, url string, ready *sync.WaitGroup, fail chan<- error) {
	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("accept", "text/event-stream")
	resp, err := client.Do(req)
	if err != nil {
		fail <- err
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 200))
		fail <- fmt.Errorf("%s: %s", resp.Status, body)
		return
	}
	buf := make([]byte, 4096)
	var tail []byte
	isReady := false
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			data := append(tail, buf[:n]...)
			if !isReady {
				if bytes.Contains(data, readyMark) {
					isReady = true
					ready.Done()
					tail = nil
				} else {
					tail = append([]byte(nil), data[max(0, len(data)-16):]...)
				}
				continue
			}
			now := float64(time.Now().UnixNano()) / 1e9
			tail = scan(data, now)
		}
		if err != nil {
			if !isReady {
				fail <- fmt.Errorf("closed before ready: %v", err)
			} else if measuring.Load() {
				atomic.AddInt64(&ended, 1)
			}
			return
		}
	}
}

func main() {
	if len(os.Args) != 8 {
		fmt.Fprintln(os.Stderr, "usage: watch_h2 HOST PORT KEYS FIRST COUNT SECONDS STREAMS_PER_CONNECTION")
		os.Exit(2)
	}
	host, port := os.Args[1], os.Args[2]
	keys, _ := strconv.Atoi(os.Args[3])
	first, _ := strconv.Atoi(os.Args[4])
	count, _ := strconv.Atoi(os.Args[5])
	seconds, _ := strconv.ParseFloat(os.Args[6], 64)
	perConn, _ := strconv.Atoi(os.Args[7])

	var ready sync.WaitGroup
	ready.Add(count)
	fail := make(chan error, count)
	started := time.Now()
	var client *http.Client
	for i := 0; i < count; i++ {
		if i%perConn == 0 { // a transport of its own: exactly one connection for these streams
			protocols := new(http.Protocols)
			protocols.SetUnencryptedHTTP2(true)
			client = &http.Client{Transport: &http.Transport{
				Protocols:       protocols,
				MaxConnsPerHost: 1,
				DialContext:     (&net.Dialer{}).DialContext,
				TLSClientConfig: &tls.Config{},
				HTTP2:           &http.HTTP2Config{MaxConcurrentStreams: perConn},
			}}
		}
		url := fmt.Sprintf("http://%s:%s/v1/tables/quotes/watch?key=k%07d", host, port, (first+i)%keys)
		go watch(client, url, &ready, fail)
	}
	done := make(chan struct{})
	go func() { ready.Wait(); close(done) }()
	select {
	case err := <-fail:
		fmt.Fprintln(os.Stderr, "watch_h2:", err)
		os.Exit(1)
	case <-done:
	}
	fmt.Printf("{\"ready\": %d, \"seconds\": %.3f}\n", count, time.Since(started).Seconds())
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		os.Exit(1) // the driver left
	}
	measuring.Store(true)
	time.Sleep(time.Duration(seconds * float64(time.Second)))
	measuring.Store(false)
	var parts []string
	for b := range hist {
		if v := atomic.LoadInt64(&hist[b]); v > 0 {
			parts = append(parts, fmt.Sprintf("\"%d\": %d", b, v))
		}
	}
	sort.Strings(parts) // any order will do; sorted reads better
	fmt.Printf("{\"hist\": {%s}, \"events\": %d, \"ended\": %d, \"open\": %d}\n",
		strings.Join(parts, ", "), atomic.LoadInt64(&events), atomic.LoadInt64(&ended), count)
}
