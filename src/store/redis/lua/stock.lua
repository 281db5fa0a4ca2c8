-- stock.lua: records the stock an order service reported for a queue, or
-- only reads it.
-- KEYS[1..8], ARGV[1..2]: see common.lua.   KEYS[9] the queue's stock HASH
-- (see common.lua; in the queue's hash tag)   KEYS[10] the queue's audit
-- STREAM (common.lua): a 'soldOut' entry when the report makes it so
-- ARGV[3] units remaining ('' to read only)   ARGV[4] most one buyer takes
-- Returns {remaining, per, consumed, holders, admissible, soldout (1/0)},
-- or {} when only reading a queue no report linked. A report resets the
-- tokens used since the last one, marks the queue sold out when nothing
-- is left (publishing {"kind":"soldOut"} once, on the change) and reopens
-- a sold-out line when units are back (reopened = now: absent buyers are
-- not dropped for abandonAfter from then, see admit.lua). The flag's
-- STRING copy (sold_out_key, common.lua) changes with it.
-- Atomic so the sold-out mark changes once however many instances report
-- at once (one event), and the counts answered are those of one instant.
local key = KEYS[9]
local now = now_ms()
expire_active(now)
if ARGV[3] ~= '' then
  local remaining = tonumber(ARGV[3])
  local was = sold_out(key)
  local is = remaining == 0
  redis.call('HSET', key, 'remaining', ARGV[3], 'per', ARGV[4], 'consumed', 0, 'soldout', is and 1 or 0)
  copy_sold_out(key, is)
  if was and not is then
    redis.call('HSET', key, 'reopened', now)
  end
  if is and not was then
    publish(cjson.encode({kind = 'soldOut'}))
    audit(KEYS[10], 'soldOut', now)
  end
elseif redis.call('EXISTS', key) == 0 then
  return {}
end
local s = redis.call('HMGET', key, 'remaining', 'per', 'consumed')
local room = stock_room(key)
return {tonumber(s[1]), tonumber(s[2]), tonumber(s[3]) or 0, redis.call('ZCARD', K.active), room,
        sold_out(key) and 1 or 0}
