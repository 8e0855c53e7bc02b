-- wrk script for perf/herd.sh: GET /<code> cycling through CODES_FILE (from a random start),
-- requests formatted once in init; counts answers by status and prints them at the end
-- ("statuses 302=… 404=… 503=…"), summed over threads.
local reqs = {}
local n, i = 0, 0
local counts = {}
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
  counts[status] = (counts[status] or 0) + 1
end

done = function(summary, latency, requests)
  local total = {}
  for _, t in ipairs(threads) do
    local c = t:get("counts")
    for s, k in pairs(c) do total[s] = (total[s] or 0) + k end
  end
  local parts = {}
  for s, k in pairs(total) do parts[#parts + 1] = s .. "=" .. k end
  table.sort(parts)
  io.write("statuses " .. table.concat(parts, " ") .. "\n")
end
