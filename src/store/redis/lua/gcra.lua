-- gcra.lua: a helper prepended to the scripts that keep request rates
-- (enter, status, spend); not a script on its own.
--
-- gcra(key, now, period, burst): one request against the GCRA bucket in
-- STRING `key` (its "theoretical arrival time", ms on the store clock):
-- `burst` requests at once, then one every `period` ms. Returns 0 and
-- stores the new time (expiring when the bucket is full again, so idle
-- buckets cost nothing), or the ms to wait, changing nothing. The same
-- arithmetic as `Rate::spend` in src/store/mod.rs. gcra_stored(key,
-- stored, ...) is the same with the bucket's value already read (the
-- caller's MGET; false when absent).
local function gcra_stored(key, stored, now, period, burst)
  local tat = stored and stored + 0 or 0
  if tat < now then
    tat = now
  end
  local next_tat = tat + period
  local window = period * burst
  if next_tat - now > window then
    return next_tat - now - window
  end
  -- Numbers as strings made here: a number passed to redis.call is
  -- printed as a float (%.17g), several times dearer than '%d'.
  redis.call('SET', key, string.format('%d', next_tat), 'PX', string.format('%d', next_tat - now))
  return 0
end

local function gcra(key, now, period, burst)
  return gcra_stored(key, redis.call('GET', key), now, period, burst)
end

-- The refusal row of the scripts that return describe() rows:
-- {'limited', 0, -1, -1, <which limit>, <ms to wait>, -1, 0, 0}.
local function limited(kind, wait)
  return {'limited', 0, -1, -1, kind, wait, -1, 0, 0}
end

-- address_limits(pre, places_key, joins_key, now, max_places, join_period,
-- join_burst, before_scan, scan_arg): the client address's limits on a new place
-- (in line or in a lottery's pre-queue), shared by join.lua and
-- lottery_join.lua so both count an address alike. Places (ZSET user ->
-- entry id) are counted after forgetting those that ended (place_live,
-- common.lua; `pre` is the lottery's pre-queue key, so its entries count
-- too); `before_scan(scan_arg)` (if given) runs before that scan reads
-- the line (a function and its argument, so a join makes no closure). Then
-- one join against the address's GCRA bucket. Returns limited(...) for
-- the first limit hit, or nil (the join rate then counted).
local function address_limits(pre, places_key, joins_key, now, max_places, join_period, join_burst, before_scan, scan_arg)
  if max_places > 0 and redis.call('ZCARD', places_key) >= max_places then
    if before_scan then
      before_scan(scan_arg)
    end
    local held = redis.call('ZRANGE', places_key, 0, -1, 'WITHSCORES')
    for i = 1, #held, 2 do
      if not place_live(pre, held[i], tonumber(held[i + 1])) then
        redis.call('ZREM', places_key, held[i])
      end
    end
    if redis.call('ZCARD', places_key) >= max_places then
      return limited('address_places', 10000)
    end
  end
  if join_period > 0 then
    local wait = gcra(joins_key, now, join_period, join_burst)
    if wait > 0 then
      return limited('address_joins', wait)
    end
  end
  return nil
end
