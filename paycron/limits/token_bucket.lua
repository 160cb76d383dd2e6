-- Take up to ARGV[1] tokens (a negative ARGV[1] gives tokens back) from a bucket refilled at ARGV[2] tokens/s up to
-- ARGV[3]; returns how many were granted. Time comes from the Redis server,
-- so every scheduler shares one clock and one bucket.
local key = KEYS[1]
local want = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local capacity = tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local state = redis.call('HMGET', key, 'tokens', 'at')
local tokens = tonumber(state[1])
local at = tonumber(state[2])
if tokens == nil then
  tokens = capacity
  at = now
end
tokens = math.min(capacity, tokens + math.max(0, now - at) * rate)
local granted = 0
if want < 0 then
  tokens = math.min(capacity, tokens - want)
else
  granted = math.min(want, math.floor(tokens))
  tokens = tokens - granted
end
redis.call('HSET', key, 'tokens', tostring(tokens), 'at', tostring(now))
redis.call('EXPIRE', key, math.ceil(capacity / rate) + 60)
return granted
