/** The egress policy's parsing, naming rules, address slots and allow-set text, without root. */
import test from 'ava';
import {
  nameAllowed,
  parseAllowEntry,
  parseCidr,
  validateNetworkOptions,
  networkInfo,
} from '../../src/host/network/policy.js';
import { slotAddresses, slotCount } from '../../src/host/network/addresses.js';
import {
  addElementsScript,
  addUploadLimitScript,
  deleteUploadLimitsScript,
  parseAllowSet,
  parseUploadLimits,
  rulesetScript,
} from '../../src/host/network/nftables.js';
import { resolveConfig } from '../../src/config.js';

test('allow entries: addresses, CIDRs, ports and domains', (t) => {
  t.deepEqual(parseAllowEntry('203.0.113.7'), { cidr: '203.0.113.7/32', ports: [0, 65535] });
  t.deepEqual(parseAllowEntry('198.51.100.9/24:443'), { cidr: '198.51.100.0/24', ports: [443, 443] });
  t.deepEqual(parseAllowEntry('192.0.2.0/24:8000-8100'), { cidr: '192.0.2.0/24', ports: [8000, 8100] });
  t.deepEqual(parseAllowEntry('*.PyPI.org:443'), { domain: 'pypi.org', ports: [443, 443] });
  for (const bad of ['', '300.1.1.1', '10.0.0.0/33', 'example.com:0', 'example.com:9-1', 'localhost', 'a b.com', 7])
    t.throws(() => parseAllowEntry(bad), { code: 'INVALID_ARGUMENT' }, String(bad));
});

test('modes: none is the default, refuses an allow list; egress without entries is open', (t) => {
  t.is(validateNetworkOptions({}), null);
  t.throws(() => validateNetworkOptions({ allowOut: ['1.2.3.4'] }), { code: 'INVALID_ARGUMENT' });
  t.throws(() => validateNetworkOptions({ network: 'bridge' as never }), { code: 'INVALID_ARGUMENT' });
  const open = validateNetworkOptions({ network: 'egress' })!;
  t.deepEqual(open.cidrs, [{ cidr: '0.0.0.0/0', ports: [0, 65535] }]);
  t.truthy(nameAllowed(open, 'anything.example'));
  t.is(validateNetworkOptions({}, 'egress')?.mode, 'egress');
  t.throws(() => validateNetworkOptions({ network: 'egress', bandwidthMbit: 0 }), { code: 'INVALID_ARGUMENT' });
});

test('names: an allowed domain covers itself and its subdomains only', (t) => {
  const p = validateNetworkOptions({ network: 'egress', allowOut: ['example.com:443'] })!;
  t.deepEqual(nameAllowed(p, 'api.example.com.'), { domain: 'example.com', ports: [443, 443] });
  t.truthy(nameAllowed(p, 'EXAMPLE.com'));
  t.is(nameAllowed(p, 'badexample.com'), undefined);
  t.is(nameAllowed(p, 'example.com.evil.test'), undefined);
  t.deepEqual(networkInfo(JSON.stringify(p), { address: '10.0.0.3', gateway: '10.0.0.2' }).allowOut, [
    'example.com:443',
  ]);
});

test('slots are /31s of the range; the range is checked by the config', (t) => {
  t.deepEqual(slotAddresses('10.213.0.0/16', 1), {
    slot: 1,
    gateway: '10.213.0.2',
    address: '10.213.0.3',
    prefixLength: 31,
  });
  t.is(slotCount('10.213.0.0/24'), 128);
  t.is(parseCidr('10.1.2.3/8')!.text, '10.0.0.0/8');
  t.throws(() => resolveConfig({ networkRange: '8.8.0.0/16' }, {}), { code: 'CONFIG_INVALID' });
  t.throws(() => resolveConfig({ networkRange: '10.0.0.1/16' }, {}), { code: 'CONFIG_INVALID' });
  t.throws(() => resolveConfig({}, { LOCKSTEP_DNS_UPSTREAM: 'dns.example' }), { code: 'CONFIG_INVALID' });
  t.deepEqual(resolveConfig({}, { LOCKSTEP_NETWORK_DENY: '192.168.0.0/16, 172.16.0.1' }).networkDeny, [
    '192.168.0.0/16',
    '172.16.0.1/32',
  ]);
});

test('the ruleset denies the range and metadata before the allow set; elements round-trip through nft JSON', (t) => {
  const rs = rulesetScript({ table: 'lockstep_x', ifPrefix: 'lhabc', range: '10.9.0.0/24', deny: ['192.168.0.0/16'] });
  t.regex(
    rs,
    /add element inet lockstep_x deny4 \{ [^}]*169\.254\.0\.0\/16[^}]*10\.9\.0\.0\/24[^}]*192\.168\.0\.0\/16/,
  );
  t.true(rs.indexOf('@deny4') < rs.indexOf('@allow4'));
  t.regex(rs, /sandbox_to_host reject/);
  t.is(
    addElementsScript('t', [
      { sandbox: '10.9.0.3', cidr: '1.2.3.4/32', proto: 'tcp', ports: [443, 443], timeoutS: 60 },
    ]),
    'add element inet t allow4 { 10.9.0.3 . 1.2.3.4/32 . tcp . 443 timeout 60s }\n',
  );
  const json = JSON.stringify({
    nftables: [
      { metainfo: {} },
      {
        set: {
          elem: [
            {
              elem: {
                val: { concat: ['10.9.0.3', { prefix: { addr: '1.2.0.0', len: 16 } }, 'tcp', { range: [80, 443] }] },
                timeout: 60,
              },
            },
            { concat: ['10.9.0.5', '1.2.3.4', 'udp', 53] },
          ],
        },
      },
    ],
  });
  t.deepEqual(parseAllowSet(json), [
    { sandbox: '10.9.0.3', cidr: '1.2.0.0/16', proto: 'tcp', ports: [80, 443] },
    { sandbox: '10.9.0.5', cidr: '1.2.3.4/32', proto: 'udp', ports: [53, 53] },
  ]);
});

test('upload caps: a limit object per sandbox address in uplimit, dropped past the rate; parsed back from nft -j', (t) => {
  t.is(
    addUploadLimitScript('lockstep_x', '10.9.0.3', 8),
    'add limit inet lockstep_x up_10_9_0_3 { rate over 1000 kbytes/second burst 32 kbytes }\n' +
      'add element inet lockstep_x uplimit { 10.9.0.3 : "up_10_9_0_3" }\n',
  );
  t.is(
    deleteUploadLimitsScript('lockstep_x', ['10.9.0.3']),
    'delete element inet lockstep_x uplimit { 10.9.0.3 }\ndelete limit inet lockstep_x up_10_9_0_3\n',
  );
  const rs = rulesetScript({ table: 'lockstep_x', ifPrefix: 'lhabc', range: '10.9.0.0/24', deny: [] });
  t.regex(rs, /add map inet lockstep_x uplimit \{ type ipv4_addr : limit; \}/);
  t.regex(rs, /from_sandbox limit name ip saddr map @uplimit drop/);
  // What nft 1.0.6 prints for `nft -j list map inet T uplimit`.
  const json = JSON.stringify({
    nftables: [
      { metainfo: { version: '1.0.6' } },
      {
        map: {
          family: 'inet',
          name: 'uplimit',
          table: 'lockstep_x',
          type: 'ipv4_addr',
          map: 'limit',
          elem: [['10.9.0.3', 'up_10_9_0_3']],
        },
      },
    ],
  });
  t.deepEqual(parseUploadLimits(json), ['10.9.0.3']);
});
