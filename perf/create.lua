-- wrk script for perf/create.sh: POST /v1/links with a distinct destination per request
-- (creates never deduplicate, but distinct URLs make the check after the run meaningful).
local counter = 0
local key = os.getenv("LASTHOP_API_KEY")
local thread_tag = tostring(math.random(1, 1e9))

request = function()
  counter = counter + 1
  local body = '{"long_url":"https://example.com/perf/' .. thread_tag .. '/' .. counter .. '?utm_source=load"}'
  return wrk.format("POST", "/v1/links", {
    ["Authorization"] = "Bearer " .. key,
    ["Content-Type"] = "application/json",
  }, body)
end
