-- turn.lua: takes the queue's admission turn for the calling instance.
-- KEYS[1] the queue's turn STRING (under its hash tag): the id of the
-- instance that holds it, expiring with the hold
-- ARGV[1] the caller's id (one per store, random)  ARGV[2] hold in ms
-- Returns 1 when the caller holds the turn now (it was free, had lapsed, or
-- was the caller's own: held again for ARGV[2] ms), else 0 (another
-- instance's hold has not lapsed: the caller skips this pass).
-- Why: every instance runs the admission loop on the shared bucket, so N
-- instances would pass N times an interval, each pass moving every waiting
-- buyer and so sending every stream N rank updates where one would do. The
-- turn gives one pass per interval whatever N; the bucket still sets the
-- rate. Atomic so two instances never both find it free, and so an
-- instance's own turn is renewed rather than refused (its late tick and the
-- next one on time may come closer than the hold).
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
