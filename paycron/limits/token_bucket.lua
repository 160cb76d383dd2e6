-- Take tokens from a bucket refilled at ARGV[2] tokens/s up to ARGV[3]; time
-- comes from the Redis server, so every process shares one clock and one bucket.
-- ARGV[1] > 0: take up to that many; returns how many were granted (0 to ARGV[1]).
-- ARGV[1] < 0: give that many back; returns 0.
-- ARGV[4] = '1' (all or nothing): take exactly ARGV[1] or none; returns ARGV[1]
-- when granted, else minus the whole tokens still missing (<= -1), so the
-- caller can say when they will be there. One script run: atomic.
-- ARGV[5] (all or nothing only, optional): once ARGV[1] is granted, also take
-- up to that many more if they are there (a caller's allowance for its next
-- requests); the answer counts them. ARGV[6] (optional): tokens the caller
-- gives back first (what is left of an earlier allowance).
local key = KEYS[1]
local want = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local capacity = tonumber(ARGV[3])
local all_or_nothing = ARGV[4] == '1'
local extra = tonumber(ARGV[5] or '0') or 0
local returned = tonumber(ARGV[6] or '0') or 0
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local state = redis.call('HMGET', key, 'tokens', 'at')
local tokens = tonumber(state[1])
local at = tonumber(state[2])
if tokens == nil then
  tokens = capacity
  at = now
end
tokens = math.min(capacity, tokens + math.max(0, now - at) * rate + returned)
local granted = 0
if want < 0 then
  tokens = math.min(capacity, tokens - want)
elseif all_or_nothing then
  if tokens >= want then
    granted = want + math.max(0, math.min(extra, math.floor(tokens - want)))
    tokens = tokens - granted
  else
    granted = -math.ceil(want - tokens)
  end
else
  granted = math.min(want, math.floor(tokens))
  tokens = tokens - granted
end
redis.call('HSET', key, 'tokens', tostring(tokens), 'at', tostring(now))
redis.call('EXPIRE', key, math.ceil(capacity / rate) + 60)
return granted
