-- pause.lua: holds or resumes a queue's admissions (operators).
-- KEYS, ARGV[1..2]: see common.lua.   ARGV[3] 1 = hold, 0 = resume
-- Returns 1 if the state changed, else 0.
-- A script like every other state change, so the flag lives under the
-- queue's hash tag and is read by admit and enter in the same slot.
if ARGV[3] == '1' then
  return redis.call('SET', K.paused, '1', 'NX') and 1 or 0
end
return redis.call('DEL', K.paused)
