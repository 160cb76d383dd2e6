-- A group's calls (and failures) counted in this second's buckets; with
-- failures, whether the window is now bad: 1 if at least ARGV[5] calls in
-- the last ARGV[2] seconds and at least ARGV[6] of them failed. The rules
-- of CircuitBreaker.record in one round trip.
-- KEYS: the calls and fails bucket prefixes. ARGV: second, window, calls,
-- failures, min calls, failure ratio.
local second = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local failures = tonumber(ARGV[4])
local calls_key = KEYS[1] .. ':' .. second
redis.call('INCRBY', calls_key, ARGV[3])
redis.call('EXPIRE', calls_key, window + 5)
if failures <= 0 then
  return 0
end
local fails_key = KEYS[2] .. ':' .. second
redis.call('INCRBY', fails_key, failures)
redis.call('EXPIRE', fails_key, window + 5)
local calls, fails = 0, 0
for s = second - window + 1, second do
  calls = calls + tonumber(redis.call('GET', KEYS[1] .. ':' .. s) or '0')
  fails = fails + tonumber(redis.call('GET', KEYS[2] .. ':' .. s) or '0')
end
if calls >= tonumber(ARGV[5]) and fails >= tonumber(ARGV[6]) * calls then
  return 1
end
return 0
