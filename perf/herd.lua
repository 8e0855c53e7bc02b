-- wrk script for perf/herd.sh: GET /<code> cycling through CODES_FILE (from a random start),
-- requests formatted once in init; counts answers by status and prints them at the end
-- ("statuses 302=… 404=… 503=…"), summed over threads.
local reqs = {}
local n, i = 0, 0
-- Counters are plain globals: wrk's thread:get copies numbers, not tables.
c302, c404, c503, cother = 0, 0, 0, 0
local threads = {}

setup = function(thread)
  table.insert(threads, thread)
end

init = function(args)
  for line in io.lines(os.getenv("CODES_FILE")) do
    n = n + 1
    reqs[n] = wrk.format("GET", "/" .. line)
  end
  math.randomseed(os.time() + n)
  i = math.random(1, n)
end

request = function()
  i = i + 1
  if i > n then i = 1 end
  return reqs[i]
end

response = function(status, headers, body)
  if status == 302 then c302 = c302 + 1
  elseif status == 404 then c404 = c404 + 1
  elseif status == 503 then c503 = c503 + 1
  else cother = cother + 1 end
end

done = function(summary, latency, requests)
  local t302, t404, t503, tother = 0, 0, 0, 0
  for _, t in ipairs(threads) do
    t302 = t302 + t:get("c302")
    t404 = t404 + t:get("c404")
    t503 = t503 + t:get("c503")
    tother = tother + t:get("cother")
  end
  io.write(string.format("statuses 302=%d 404=%d 503=%d other=%d\n", t302, t404, t503, tother))
end
