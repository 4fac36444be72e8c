// Calls a Prism router from Node's pure-JS gRPC (@grpc/grpc-js), as a
// ranking service written in Node would: Recommend and RecommendStream
// over mutual TLS and with the bearer token, gzip-compressed, health and
// reflection. One line per check, "ok NAME" or "FAIL NAME: why"; exits 1
// when any failed.
//
//   node client.js --addr 127.0.0.1:8500 --certs CERTS --token-file FILE --request REQ.json [--http 127.0.0.1:8501]
//
// With --http (prism up --http-addr), the same request goes over
// HTTP/JSON too, written as a Node service writes JSON (JSON.stringify
// of JS numbers: ids as numbers, floats in JS's own form), with Node's
// https module: its scores must equal the gRPC call's.
//
// CERTS is the folder prism up or prism certs init wrote (its admin/);
// REQ.json a request of prism loadgen --print-request 1 (for the served
// model). The protos are read from api/prismv1 of this checkout.
'use strict';
const fs = require('fs');
const https = require('https');
const path = require('path');
const grpc = require('@grpc/grpc-js');
const loader = require('@grpc/proto-loader');

const args = {};
for (let i = 2; i < process.argv.length; i += 2) args[process.argv[i].replace(/^--/, '')] = process.argv[i + 1];
for (const k of ['addr', 'certs', 'request']) {
  if (!args[k]) {
    console.error(`usage: node client.js --addr HOST:PORT --certs DIR --request REQ.json [--token-file FILE]; --${k} missing`);
    process.exit(2);
  }
}
const api = path.join(__dirname, '..', '..', '..', 'api', 'prismv1');
// int64 as strings (version, ids), as proto3 JSON has them.
const defs = loader.loadSync([path.join(api, 'recommend.proto'), path.join(__dirname, 'protos', 'health.proto'), path.join(__dirname, 'protos', 'reflection.proto')],
  {keepCase: true, longs: String, enums: String, defaults: false, oneofs: true});
const pkg = grpc.loadPackageDefinition(defs);
const read = f => fs.readFileSync(path.join(args.certs, 'admin', f));
const ca = read('ca.pem');
const mtls = grpc.credentials.createSsl(ca, read('key.pem'), read('cert.pem'));
const token = args['token-file'] && fs.readFileSync(args['token-file'], 'utf8').trim();
const bearer = token && grpc.credentials.combineChannelCredentials(grpc.credentials.createSsl(ca),
  grpc.credentials.createFromMetadataGenerator((_, cb) => { const md = new grpc.Metadata(); md.set('authorization', 'Bearer ' + token); cb(null, md); }));
const req = JSON.parse(fs.readFileSync(args.request, 'utf8'));
// Keepalive as Node services commonly set it (every 10 s, idle too).
const channel = {'grpc.keepalive_time_ms': 10000, 'grpc.keepalive_permit_without_calls': 1};
const gzip = {...channel, 'grpc.default_compression_algorithm': 2};
const recommender = (creds, opts = channel) => new pkg.prism.v1.Recommender(args.addr, creds, opts);
const deadline = () => ({deadline: Date.now() + 20000});

function recommend(c, r) {
  return new Promise(res => c.Recommend(r, deadline(), (err, v) => res({err, v})));
}

// stream sends reqs on one RecommendStream, half-closes, and collects
// the answers and the final status.
function stream(c, reqs) {
  return new Promise(res => {
    const s = c.RecommendStream(deadline());
    const out = [];
    let err = null;
    s.on('data', d => out.push(d));
    s.on('error', e => { err = e; });
    s.on('status', () => res({out, err}));
    for (const r of reqs) s.write(r);
    s.end();
  });
}

const describe = err => `${grpc.status[err.code]} (${err.code}): ${err.details}`;
let failed = 0;
function check(name, ok, why) {
  console.log(ok ? `ok ${name}` : `FAIL ${name}: ${why}`);
  if (!ok) failed++;
}
function scored(name, {err, v}) {
  const n = v && v.scores ? v.scores.length : 0;
  check(name, !err && n === req.num_candidates, err ? describe(err) : `${n} scores for ${req.num_candidates} candidates`);
  return v && v.scores;
}

(async () => {
  const byCert = scored('Recommend with the admin certificate', await recommend(recommender(mtls), req));
  if (bearer) {
    scored('Recommend with the bearer token', await recommend(recommender(bearer), req));
    const {err} = await recommend(recommender(grpc.credentials.createSsl(ca)), req);
    check('Recommend without certificate or token is UNAUTHENTICATED', err && err.code === grpc.status.UNAUTHENTICATED, err ? describe(err) : 'answered');
  }
  const zipped = scored('Recommend gzip-compressed', await recommend(recommender(mtls, gzip), req));
  check('gzip-compressed scores equal the uncompressed', JSON.stringify(zipped) === JSON.stringify(byCert), `${zipped} vs ${byCert}`);

  const bad = {...req, model: 'no-such-model', request_id: 'bad'};
  const {out, err} = await stream(recommender(mtls, gzip), [{...req, request_id: 'a'}, bad, {...req, request_id: 'c'}]);
  const got = out.map(o => `${o.request_id}:${o.error ? 'error ' + o.error.code : (o.scores || []).length}`).join(' ');
  check('RecommendStream gzip-compressed: answers in order, a failed request in its answer', !err && got === `a:${req.num_candidates} bad:error ${grpc.status.NOT_FOUND} c:${req.num_candidates}`, err ? describe(err) : got);
  const empty = await stream(recommender(mtls), []);
  check('RecommendStream half-closed at once ends OK', !empty.err && empty.out.length === 0, empty.err ? describe(empty.err) : `${empty.out.length} answers`);

  const health = new pkg.grpc.health.v1.Health(args.addr, bearer || mtls, channel);
  for (const service of ['', 'prism.v1.Recommender']) {
    const h = await new Promise(res => health.Check({service}, deadline(), (e, v) => res(e ? describe(e) : v.status)));
    check(`health of "${service}" SERVING`, h === 'SERVING', h);
  }

  const refl = new pkg.grpc.reflection.v1.ServerReflection(args.addr, bearer || mtls, channel);
  const services = await new Promise(res => {
    const s = refl.ServerReflectionInfo(deadline());
    let names = [];
    s.on('data', d => { if (d.list_services_response) names = d.list_services_response.service.map(x => x.name); });
    s.on('error', e => res(describe(e)));
    s.on('status', () => res(names.join(',')));
    s.write({list_services: ''});
    s.end();
  });
  check('reflection lists prism.v1.Recommender', String(services).split(',').includes('prism.v1.Recommender'), services);

  if (args.http) {
    // The request as a Node service builds it: numbers, not proto3
    // JSON's quoted int64s.
    const native = {...req, candidates: {inputs: req.candidates.inputs.map(i => ({...i, ...(i.ids ? {ids: i.ids.map(Number)} : {})}))}};
    const post = (body, opts = {}) => new Promise(res => {
      const r = https.request({host: args.http.replace(/:\d+$/, ''), port: Number(args.http.replace(/^.*:/, '')), path: '/v1/recommend', method: 'POST',
        ca, headers: {'Content-Type': 'application/json', 'X-Prism-Timeout': '20s', ...(opts.headers || {})}, ...opts.tls}, resp => {
        let data = '';
        resp.on('data', c => { data += c; });
        resp.on('end', () => res({status: resp.statusCode, body: data}));
      });
      r.on('error', e => res({status: 0, body: String(e)}));
      r.end(body);
    });
    const body = JSON.stringify(native);
    const a = await post(body, {tls: {key: read('key.pem'), cert: read('cert.pem')}});
    let scores = null;
    try { scores = JSON.parse(a.body).scores; } catch (e) { /* checked below */ }
    // A float32 printed shortest and read back as a double: compared as
    // float32 (Math.fround), as the gRPC call's scores are.
    const same = scores && byCert && scores.length === byCert.length && scores.every((v, i) => Math.fround(v) === Math.fround(byCert[i]));
    check('HTTP/JSON Recommend (Node JSON, admin certificate) scores equal gRPC\'s', a.status === 200 && same, `${a.status} ${a.body.slice(0, 300)}`);
    if (token) {
      const b = await post(body, {headers: {Authorization: 'Bearer ' + token}});
      check('HTTP/JSON Recommend with the bearer token', b.status === 200, `${b.status} ${b.body.slice(0, 300)}`);
    }
    const c = await post(body);
    let code = '';
    try { code = JSON.parse(c.body).code; } catch (e) { /* checked below */ }
    check('HTTP/JSON without certificate or token is 401 UNAUTHENTICATED', c.status === 401 && code === 'UNAUTHENTICATED', `${c.status} ${c.body.slice(0, 300)}`);
  }

  console.log(failed ? `${failed} check(s) failed` : 'all checks passed');
  process.exit(failed ? 1 : 0);
})();
