"""loadtest/enter-many-cost.py: what one enter_many.lua call costs Redis per
join, for a fixed group size, without a server or generator in the way.

Usage: enter-many-cost.py PORT G CALLS REPEATS VARIANTS LUA_DIRS
  PORT      a private redis-server (flushed here)
  G         joins per call (new buyers, nobody admitted)
  CALLS     calls per run; REPEATS runs per variant, interleaved
  VARIANTS  comma-separated: plain (the baseline's one-join script, one
            call per join) and names of LUA_DIRS entries
  LUA_DIRS  comma-separated name=dir, each dir holding common.lua, gcra.lua,
            join.lua, enter_many.lua (assembled as src/store/redis/scripts.rs
            does); a dir whose enter_many.lua takes a group number
            (ARGV[14], the fence) is detected by its text
Prints per variant and run: Redis time inside EVALSHA per join (µs,
INFO commandstats, wall time) / Redis CPU per join (µs, INFO cpu).
Calls are pipelined 8 at a time (env PIPE), back to back; env GAP_US=N
sleeps N µs after each pipelined batch, so Redis idles between calls as it
does behind a server that cannot keep it busy (on this machine a core that
idles runs the same call slower: see the README's group-commit section).
Loopback only, bounded by CALLS.
"""
import socket, sys, random, hashlib
port = int(sys.argv[1]); G = int(sys.argv[2]); CALLS = int(sys.argv[3])
DIRS = dict(x.split('=', 1) for x in sys.argv[6].split(','))
def enc(args):
    out = [b'*%d\r\n' % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b'$%d\r\n%s\r\n' % (len(a), a))
    return b''.join(out)
class R:
    def __init__(s):
        s.s = socket.create_connection(('127.0.0.1', port)); s.f = s.s.makefile('rb')
    def cmd(s, *a):
        s.s.sendall(enc(a)); return s.read()
    def read(s):
        l = s.f.readline()
        t, r = l[:1], l[1:-2]
        if t == b'+': return r
        if t == b'-': raise Exception(r)
        if t == b':': return int(r)
        if t == b'$':
            n = int(r)
            if n < 0: return None
            d = s.f.read(n + 2); return d[:-2]
        if t == b'*':
            n = int(r)
            return None if n < 0 else [s.read() for _ in range(n)]
import os, time
PIPE = int(os.environ.get('PIPE', '8'))
GAP = float(os.environ.get('GAP_US', '0')) / 1e6
r = R()
prelude = "local PUBLISH = 'PUBLISH'\nlocal PUBLISH_PASS = true\nlocal AUDIT_MAXLEN = 100000\n"
def script(d):
    rd = lambda f: open(f'{DIRS[d]}/{f}.lua').read()
    return prelude + rd('common') + '\n' + rd('gcra') + '\n' + rd('join') + '\n' + rd('enter_many')
shas = {d: r.cmd('SCRIPT', 'LOAD', script(d)).decode() for d in DIRS}
fenced = {d: 'ARGV[14]' in open(f'{DIRS[d]}/enter_many.lua').read() or 'fence' in open(f'{DIRS[d]}/enter_many.lua').read() for d in DIRS}
# Since 20261202 the shared arguments are one packed string (join.lua's
# join_config, budget first) and the group number follows it.
packed = {d: 'join_head' in open(f'{DIRS[d]}/join.lua').read() for d in DIRS}
PLAIN = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'plain-join/src/join.lua')).read()
shas['plain'] = r.cmd('SCRIPT', 'LOAD', PLAIN).decode()
def usec(name):
    info = r.cmd('INFO', 'commandstats').decode()
    for l in info.splitlines():
        if l.startswith('cmdstat_evalsha:'):
            return float(l.split('usec=')[1].split(',')[0])
    return 0.0
def cpu():
    info = r.cmd('INFO', 'cpu').decode()
    v = dict(l.split(':') for l in info.splitlines() if ':' in l)
    return float(v['used_cpu_user']) + float(v['used_cpu_sys'])
first = random.randrange(1, 1 << 40)
shared = [300000, 1, 3600000, 0, first, 1000, 10, 5000, 0, 0, 0]
shared_packed = ['1000 10 5000 %d 300000 1 3600000 0 0 0 0' % first]
def run(d, q):
    base = f'b:{{{q}}}:'
    keys = [base + k for k in ['waiting', 'seq', 'entered', 'seen', 'active', 'bucket', 'pass', 'paused']]
    t0, c0 = usec('x'), cpu()
    u = 0
    pipe = []
    if d == 'plain':
        for i in range(0, CALLS * G, PIPE):
            chunk = [enc(['EVALSHA', shas['plain'], 2, base + 'waiting', base + 'seq', 'user-%08d' % (i + j)]) for j in range(PIPE)]
            r.s.sendall(b''.join(chunk))
            for _ in chunk:
                r.read()
            if GAP:
                time.sleep(GAP)
        return (usec('x') - t0) / (CALLS * G), (cpu() - c0) * 1e6 / (CALLS * G)
    for call in range(CALLS):
        ks = list(keys); av = [base + 'token:', base + 'events'] + (shared_packed if packed[d] else shared)
        if fenced[d]: av.append(call + 1)
        for i in range(G):
            user = 'user-%08d' % u; u += 1
            ks += [base + 'token:' + user, base + 'budget:' + user]
            av += [user, 'tok' + hashlib.md5(user.encode()).hexdigest()]
        if fenced[d]: ks.append(base + 'fence:bench')
        ks += [base + 'stock', base + 'audit', base + 'lottery', base + 'prequeue']
        pipe.append(enc(['EVALSHA', shas[d], len(ks)] + ks + av))
    for i in range(0, CALLS, PIPE):
        chunk = pipe[i:i+PIPE]
        r.s.sendall(b''.join(chunk))
        for _ in chunk:
            v = r.read()
        if GAP:
            time.sleep(GAP)
    return (usec('x') - t0) / (CALLS * G), (cpu() - c0) * 1e6 / (CALLS * G)
ds = sys.argv[5].split(',')
res = {d: [] for d in ds}
for rep in range(int(sys.argv[4])):
    for d in ds:
        r.cmd('FLUSHALL')
        r.cmd('CONFIG', 'RESETSTAT')
        res[d].append(run(d, 'q%d' % rep))
for d in res:
    print(d, 'G=%d' % G, ' '.join('%.2f/%.2f' % x for x in res[d]))
