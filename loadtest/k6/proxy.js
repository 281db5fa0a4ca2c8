// loadtest/k6/proxy.js: GETs of one URL as fast as VUS closed-loop users
// can, for DURATION, with an optional Cookie (a pass). Used by
// loadtest/proxy.sh for the origin alone, nginx proxy_pass and waitroom
// --origin in the same run. Loopback only.
import http from 'k6/http';
import { check } from 'k6';

const TARGET = __ENV.TARGET || 'http://127.0.0.1:8080/';
if (!/^http:\/\/127\.0\.0\.1[:/]/.test(TARGET)) throw new Error(`loopback only: ${TARGET}`);

export const options = {
  vus: Number(__ENV.VUS || 32),
  duration: __ENV.DURATION || '10s',
  discardResponseBodies: true,
  summaryTrendStats: ['avg', 'p(50)', 'p(99)', 'max'],
};

const params = __ENV.COOKIE ? { headers: { Cookie: __ENV.COOKIE } } : {};

export default function () {
  const res = http.get(TARGET, params);
  check(res, { 'status 200': (r) => r.status === 200 });
}
