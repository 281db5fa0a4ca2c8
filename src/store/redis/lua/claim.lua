-- claim.lua: READY -> CLAIMED, for one order.
-- KEYS (KEYS[9] the user's token key of the earlier layout: common.lua), ARGV[1..2]: see common.lua.
-- ARGV[3] user  ARGV[4] presented token  ARGV[5] lease ms  ARGV[6] new claim id
-- Returns {'claimed', claim_id} | {'invalid'} | {'in_use'}.
-- Atomic because check-and-claim must be one step, or two concurrent orders
-- could both claim one token. The comparison is of interned Lua strings
-- (a pointer compare), so its time does not depend on how much matched.
-- The claim is a lease: if the order service dies it lapses back to READY,
-- and the token lives at least until the lease ends.
local user, presented, lease, claim_id = ARGV[3], ARGV[4], ARGV[5] + 0, ARGV[6]
local now = now_ms()
local t = token_get(user, K.token)
if not t or t.exp <= now or t.token ~= presented then
  return {'invalid'}
end
if t.claim and (t.claim_until or 0) > now then
  return {'in_use'}
end
local lease_end = now + lease
t.claim, t.claim_until = claim_id, lease_end
if lease_end > t.exp then
  -- Its entry's marks are kept only as long as the token first lived
  -- (trim_marks): a token that outlives that carries its time itself.
  t.entered = token_entered(user, t)
  t.exp = lease_end
  if t.old then
    -- The earlier layout's index STRING expired with the token: the
    -- moved record's index entry (token_put) outlives it.
    redis.call('PEXPIREAT', old_index(presented), lease_end)
  end
  redis.call('ZADD', K.active, lease_end, user)
end
token_put(user, t)
return {'claimed', claim_id}
