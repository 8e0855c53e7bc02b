-- wrk script for perf/redirect-vs-nginx.sh: GET /<code> with codes drawn at random from
-- CODES_FILE; SCAN_PERCENT of requests use random 7-char codes instead (a scanner mix: almost
-- all never issued). The requests are formatted once in init (64K of them per thread, cycled
-- from a random start), so the per-request Lua cost is one table index: formatting each request
-- in Lua (math.random + wrk.format) capped wrk near 45k req/s on its core, below the servers.
local alphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
local scan = tonumber(os.getenv("SCAN_PERCENT") or "0")
local count = tonumber(os.getenv("REQUESTS") or "65536")
local reqs = {}
local n = 0
local i = 0

local function random_code()
  local t = {}
  for k = 1, 7 do
    local c = math.random(1, 62)
    t[k] = alphabet:sub(c, c)
  end
  return table.concat(t)
end

init = function(args)
  local codes = {}
  for line in io.lines(os.getenv("CODES_FILE")) do
    codes[#codes + 1] = line
  end
  math.randomseed(os.time())
  for k = 1, count do
    local code
    if math.random(1, 100) <= scan then
      code = random_code()
    else
      code = codes[math.random(1, #codes)]
    end
    reqs[k] = wrk.format("GET", "/" .. code)
  end
  n = count
  i = math.random(1, n)
end

request = function()
  i = i + 1
  if i > n then i = 1 end
  return reqs[i]
end
