-- gcra.lua: a helper prepended to the scripts that keep request rates
-- (enter, status, spend); not a script on its own.
--
-- gcra(key, now, period, burst): one request against the GCRA bucket in
-- STRING `key` (its "theoretical arrival time", ms on the store clock):
-- `burst` requests at once, then one every `period` ms. Returns 0 and
-- stores the new time (expiring when the bucket is full again, so idle
-- buckets cost nothing), or the ms to wait, changing nothing. The same
-- arithmetic as `Rate::spend` in src/store/mod.rs.
local function gcra(key, now, period, burst)
  local tat = tonumber(redis.call('GET', key) or '0') or 0
  if tat < now then
    tat = now
  end
  local next_tat = tat + period
  local window = period * burst
  if next_tat - now > window then
    return next_tat - now - window
  end
  redis.call('SET', key, string.format('%d', next_tat), 'PX', next_tat - now)
  return 0
end

-- The refusal row of the scripts that return describe() rows:
-- {'limited', 0, -1, -1, <which limit>, <ms to wait>, -1, 0, 0}.
local function limited(kind, wait)
  return {'limited', 0, -1, -1, kind, wait, -1, 0, 0}
end
