-- wrk script for perf/redirect-vs-nginx.sh: GET /<code> with codes drawn at random from
-- CODES_FILE; SCAN_PERCENT of requests use random 7-char codes instead (a scanner mix: almost
-- all never issued).
local codes = {}
local alphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
local scan = tonumber(os.getenv("SCAN_PERCENT") or "0")

init = function(args)
  for line in io.lines(os.getenv("CODES_FILE")) do
    codes[#codes + 1] = line
  end
  math.randomseed(os.time())
end

local function random_code()
  local t = {}
  for i = 1, 7 do
    local k = math.random(1, 62)
    t[i] = alphabet:sub(k, k)
  end
  return table.concat(t)
end

request = function()
  local code
  if math.random(1, 100) <= scan then
    code = random_code()
  else
    code = codes[math.random(1, #codes)]
  end
  return wrk.format("GET", "/" .. code)
end
