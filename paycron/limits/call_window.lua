-- Take up to ARGV[1] gateway-call tokens from the current wall-clock second
-- (Redis server time, shared by every worker), at most ARGV[2] per second.
-- Returns {granted, milliseconds until the next second}. One atomic step:
-- no WATCH/MULTI retries however many workers contend.
local want = tonumber(ARGV[1])
local limit = tonumber(ARGV[2])
local t = redis.call('TIME')
local key = KEYS[1] .. ':' .. t[1]
local used = tonumber(redis.call('GET', key) or '0')
local granted = math.max(0, math.min(want, limit - used))
if granted > 0 then
  redis.call('INCRBY', key, granted)
  redis.call('EXPIRE', key, 3)
end
return {granted, 1000 - math.floor(tonumber(t[2]) / 1000)}
