-- wrk script: GET random keys of the shared benchmark data set.
-- Keys are key:<12 digits> below KEYS (default 100000), as redis-benchmark -r
-- names them, so every peer serves the same names. PREFIX is the path before
-- the key: /keys/ for kafka-streams-iq, /v1/tables/<t>/keys/ for tablecast.
--   KEYS=100000 PREFIX=/keys/ wrk -t1 -c64 -d10s --latency -s random_keys.lua http://127.0.0.1:7070
local n = tonumber(os.getenv("KEYS") or "100000")
local prefix = os.getenv("PREFIX") or "/keys/"

function init(args)
  -- a different sequence per wrk thread
  local addr = tonumber(tostring({}):match("0x(%x+)") or "0", 16) or 0
  math.randomseed(os.time() + addr % 100000)
end

function request()
  return wrk.format("GET", string.format("%skey:%012d", prefix, math.random(0, n - 1)))
end

-- no response() hook: it would slow wrk down; wrk itself reports
-- "Non-2xx or 3xx responses", which a run against unloaded data shows
