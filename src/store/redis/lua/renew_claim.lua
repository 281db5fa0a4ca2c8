-- renew_claim.lua: keeps a working order's claim alive (lease renewal).
-- KEYS (KEYS[9] the user's token key of the earlier layout: common.lua), ARGV[1..2]: see common.lua.
-- ARGV[3] user  ARGV[4] claim id  ARGV[5] lease ms
-- Returns 1 if this claim still held the token and its lease now ends
-- lease ms from now (the token living at least as long), 0 if the token
-- was consumed, released, expired or claimed anew (nothing is written).
-- Atomic because check-and-extend must be one step: a renewal read before
-- and written after another order's claim would steal that order's token.
local user, claim_id, lease = ARGV[3], ARGV[4], ARGV[5] + 0
local now = now_ms()
local t = token_get(user, K.token)
if not t or t.claim ~= claim_id or t.exp <= now then
  return 0
end
local lease_end = now + lease
t.claim_until = lease_end
if lease_end > t.exp then
  -- Its entry's marks are kept only as long as the token first lived
  -- (trim_marks): a token that outlives that carries its time itself.
  t.entered = token_entered(user, t)
  t.exp = lease_end
  if t.old then
    redis.call('PEXPIREAT', old_index(t.token), lease_end)
  end
  redis.call('ZADD', K.active, lease_end, user)
end
token_put(user, t)
return 1
