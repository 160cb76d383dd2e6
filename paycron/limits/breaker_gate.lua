-- Prepended to call_window.lua for the event loop's executor: the breaker
-- asked and the first tokens taken in one round trip. KEYS[2] is the
-- breaker's open_until, ARGV[3] the caller's clock, ARGV[4] 1 for a probe.
-- Open, or half-open and not the probe: {-1, 0} or {-2, 0}, no token taken.
local open_until = redis.call('GET', KEYS[2])
if open_until then
  if tonumber(ARGV[3]) < tonumber(open_until) then
    return {-1, 0}
  end
  if ARGV[4] ~= '1' then
    return {-2, 0}
  end
end
