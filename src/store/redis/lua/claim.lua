-- claim.lua: READY -> CLAIMED, for one order.
-- KEYS (KEYS[9] the user's token key), ARGV[1..2]: see common.lua.
-- ARGV[3] user  ARGV[4] presented token  ARGV[5] lease ms  ARGV[6] new claim id
-- Returns {'claimed', claim_id} | {'invalid'} | {'in_use'}.
-- Atomic because check-and-claim must be one step, or two concurrent orders
-- could both claim one token. The comparison is of interned Lua strings
-- (a pointer compare), so its time does not depend on how much matched.
-- The claim is a lease: if the order service dies it lapses back to READY,
-- and the token lives at least until the lease ends.
local user, presented, lease, claim_id = ARGV[3], ARGV[4], tonumber(ARGV[5]), ARGV[6]
local key = K.token
local now = now_ms()
local t = redis.call('HMGET', key, 'token', 'exp', 'claim', 'claimUntil')
if not t[1] or tonumber(t[2]) <= now or t[1] ~= presented then
  return {'invalid'}
end
if t[3] and tonumber(t[4]) > now then
  return {'in_use'}
end
local lease_end = now + lease
redis.call('HSET', key, 'claim', claim_id, 'claimUntil', lease_end)
if lease_end > tonumber(t[2]) then
  redis.call('HSET', key, 'exp', lease_end)
  redis.call('PEXPIREAT', key, lease_end)
  redis.call('PEXPIREAT', token_index(presented), lease_end)
  redis.call('ZADD', K.active, lease_end, user)
end
return {'claimed', claim_id}
