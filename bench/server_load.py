#!/usr/bin/env python3
"""Load benchmark of `m40-llm serve`: bench/server_load.mjs ported to Python 3
with nothing but the standard library, for machines without Node (the GPU box).

Streaming clients on loopback, one thread each. For 1, 8 and 32 concurrent
clients it prints aggregate generated tokens/s, time to first token (TTFT) and
inter-token latency (ITL) p50/p99; then one 2,000-token prompt arrives while 8
streams run, and their ITL p99 before vs during that prompt shows what chunked
prefill (--prefill-chunk) and its pacing (--prefill-slowdown) buy. Requests, definitions, percentiles and tables
are those of the .mjs, so the two scripts' results compare.

  python3 bench/server_load.py --model ../shared/models/TinyStories-656K-Q8_0.gguf [--cpu]
  python3 bench/server_load.py --url http://127.0.0.1:11434 --model-name NAME   # a running server

Options: --binary build/m40-llm, --tokens 128 (per request), --requests 2
(per client), --threads N, --prefill-chunk N, --prefill-slowdown FACTOR,
--long-prompt 2000, --levels 1,8,32 (clients per run), --gpu N (the started
server's GPU).
"""
import argparse
import codecs
import http.client
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args(argv):
    p = argparse.ArgumentParser(description='Load benchmark of `m40-llm serve` (port of bench/server_load.mjs).')
    p.add_argument('--binary', default=os.path.join(ROOT, 'build', 'm40-llm'))
    p.add_argument('--model', help='GGUF file: a server is started with it')
    p.add_argument('--url', help='a running server, e.g. http://127.0.0.1:11434')
    p.add_argument('--model-name', help="the request's model (default: --model's file name without .gguf)")
    p.add_argument('--cpu', action='store_true', help='start the server with --cpu')
    p.add_argument('--gpu', type=int, help='GPU index for the started server')
    p.add_argument('--tokens', type=int, default=128, help='tokens per request')
    p.add_argument('--requests', type=int, default=2, help='requests per client, one after the other')
    p.add_argument('--threads', type=int, help="the server's --threads")
    p.add_argument('--prefill-chunk', type=int, help="the server's --prefill-chunk")
    p.add_argument('--prefill-slowdown', type=float, help="the server's --prefill-slowdown (0: pacing off)")
    p.add_argument('--long-prompt', type=int, default=2000, help='tokens of the prompt sent while 8 streams run')
    p.add_argument('--levels', default='1,8,32', help='concurrent clients of each run, comma-separated')
    o = p.parse_args(argv)
    try:
        o.levels = [int(x) for x in o.levels.split(',')]
    except ValueError:
        p.error('--levels takes client counts such as 1,8,32')
    if not o.url and not o.model:
        p.error('give --model FILE (a server is started) or --url URL')
    return o


def now_ms():
    return time.perf_counter() * 1000.0


class Server:
    """`m40-llm serve` on a free loopback port. Its stderr is read for the
    whole run (not only until ready): a full pipe would stall the server."""

    def __init__(self, o):
        # Slots for the largest level, and for the 8 streams plus the long
        # prompt of the last experiment (else that prompt waits in the queue).
        max_clients = max(max(o.levels), 8 + 1)
        args = [o.binary, 'serve', o.model, '--port', '0', '--parallel', str(max_clients),
                '--queue', str(max_clients), '--ctx', str(o.long_prompt + o.tokens + 64)]
        if o.cpu:
            args.append('--cpu')
        if o.threads:
            args += ['--threads', str(o.threads)]
        if o.prefill_chunk:
            args += ['--prefill-chunk', str(o.prefill_chunk)]
        if o.prefill_slowdown is not None:
            args += ['--prefill-slowdown', str(o.prefill_slowdown)]
        if o.gpu is not None:
            args += ['--gpu', str(o.gpu)]
        env = dict(os.environ)
        try:
            self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE, env=env)
        except OSError as e:
            raise RuntimeError(f'cannot run {o.binary} ({e.strerror}); build it or give --binary PATH')
        self.log = ''
        self.url = None
        self._ready = threading.Event()
        threading.Thread(target=self._read_stderr, daemon=True).start()

    def _read_stderr(self):
        decoder = codecs.getincrementaldecoder('utf-8')(errors='replace')
        for line in iter(self.proc.stderr.readline, b''):
            self.log += decoder.decode(line)
            port = re.search(r'listening on http://127\.0\.0\.1:(\d+)', self.log)
            if port and not self._ready.is_set() and re.search(r'm40-llm: ready', self.log):
                self.url = f'http://127.0.0.1:{port.group(1)}'
                self._ready.set()

    def wait_ready(self):
        while not self._ready.wait(0.1):
            code = self.proc.poll()
            if code is not None:
                time.sleep(0.2)  # the last lines of stderr
                raise RuntimeError(f'serve exited with {code}:\n{self.log}')
        return self.url

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Abort:
    """Ends the streams registered with it, as the .mjs's AbortController
    does: their sockets are shut down and the readers stop quietly."""

    def __init__(self):
        self.aborted = False
        self._lock = threading.Lock()
        self._conns = []

    def register(self, conn):
        with self._lock:
            self._conns.append(conn)
            if self.aborted:
                _shutdown(conn)

    def abort(self):
        with self._lock:
            self.aborted = True
            for conn in self._conns:
                _shutdown(conn)


def _shutdown(conn):
    if conn.sock is not None:
        try:
            conn.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class Client:
    """One keep-alive connection, reused for a client's requests one after
    the other, as Node's fetch reuses its pooled connections."""

    def __init__(self, url):
        u = urllib.parse.urlsplit(url)
        self.host, self.port = u.hostname, u.port or 80
        self.conn = None

    def connect(self):
        if self.conn is None:
            self.conn = http.client.HTTPConnection(self.host, self.port)
        if self.conn.sock is None:
            self.conn.connect()
        return self.conn

    def post(self, path, body):
        if self.conn is None:
            self.conn = http.client.HTTPConnection(self.host, self.port)
        payload = json.dumps(body, separators=(',', ':')).encode()  # the bytes JSON.stringify sends
        try:
            self.conn.request('POST', path, body=payload, headers={'Content-Type': 'application/json'})
            return self.conn.getresponse()
        except Exception:
            self.close()
            raise

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def stream_once(client, model, prompt, max_tokens, abort=None):
    """One streamed completion. Returns the arrival time of each text chunk
    (one per token, except where the detokenizer holds bytes back), the
    completion tokens, and the send time."""
    sent = now_ms()
    arrivals = []
    tokens = [0]
    try:
        read_stream(client, model, prompt, max_tokens, abort, arrivals, tokens)
    except Exception:
        client.close()
        if abort is None or not abort.aborted:
            raise  # else a stream the caller ended
    return {'sent': sent, 'arrivals': arrivals, 'tokens': tokens[0]}


def read_stream(client, model, prompt, max_tokens, abort, arrivals, tokens):
    if abort is not None:
        abort.register(client.connect())
    res = client.post('/v1/completions', {
        'model': model, 'prompt': prompt, 'max_tokens': max_tokens, 'temperature': 0, 'ignore_eos': True,
        'stream': True, 'stream_options': {'include_usage': True}})
    if not 200 <= res.status < 300:
        raise RuntimeError(f'HTTP {res.status}: {res.read().decode(errors="replace")}')
    buffer = ''
    decoder = codecs.getincrementaldecoder('utf-8')(errors='replace')
    while True:
        # read1: what one read of the socket brought (at most one HTTP chunk),
        # so that the time taken after it is when those bytes arrived.
        data = res.read1(65536)
        now = now_ms()
        if not data:
            break
        buffer += decoder.decode(data)
        end = buffer.find('\n\n')
        while end >= 0:
            event = buffer[:end]
            buffer = buffer[end + 2:]
            end = buffer.find('\n\n')
            if not event.startswith('data: ') or event == 'data: [DONE]':
                continue
            j = json.loads(event[6:])
            if j.get('error'):
                raise RuntimeError(j['error'].get('message'))
            if j.get('usage'):
                tokens[0] = j['usage']['completion_tokens']
            choices = j.get('choices') or [{}]
            if choices[0].get('text'):
                arrivals.append(now)
    if abort is not None and abort.aborted:
        raise ConnectionError('stream ended by the caller')  # a shut-down socket reads as the end


def percentile(values, p):
    if not values:
        return math.nan
    s = sorted(values)
    return s[min(len(s) - 1, math.floor((p / 100) * len(s)))]


def gaps(arrivals):
    return [t - arrivals[i] for i, t in enumerate(arrivals[1:])]


def ms(x):
    return 'NaN' if math.isnan(x) else f'{x:.1f}'  # JavaScript's toFixed(1)


def _catch(errors, f, *args):
    try:
        f(*args)
    except BaseException as e:
        errors.append(e)


def in_threads(functions):
    """Runs each function on its own thread; waits for all, then raises the
    first error. Daemon threads: Ctrl-C does not wait for open streams."""
    errors = []
    threads = [threading.Thread(target=_catch, args=(errors, f), daemon=True) for f in functions]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def concurrency_level(url, model, clients, o):
    prompts = ['Once upon a time', 'The little dog', 'Lily and Ben went', 'One day, a bird']
    results = []

    def client_requests(c):
        client = Client(url)
        try:
            for _ in range(o.requests):
                results.append(stream_once(client, model, prompts[c % len(prompts)], o.tokens))
        finally:
            client.close()

    start = now_ms()
    in_threads([lambda c=c: client_requests(c) for c in range(clients)])
    seconds = (now_ms() - start) / 1000
    tokens = sum(r['tokens'] for r in results)
    ttft = [r['arrivals'][0] - r['sent'] for r in results if r['arrivals']]
    itl = [g for r in results for g in gaps(r['arrivals'])]
    return {'clients': clients, 'requests': len(results), 'tokens': tokens, 'tps': tokens / seconds,
            'ttft50': percentile(ttft, 50), 'ttft99': percentile(ttft, 99),
            'itl50': percentile(itl, 50), 'itl99': percentile(itl, 99)}


def repeated_prompt(client, model, sentence, length):
    """A prompt of `length` tokens: `sentence` repeated."""
    ids = json.loads(client.post('/tokenize', {'model': model, 'content': sentence}).read())
    prompt = []
    while len(prompt) < length:
        prompt += ids['tokens']
    del prompt[length:]
    return prompt


def long_prompt_during_streams(url, model, o):
    """8 streams run; once each has produced tokens for a while, one long
    prompt arrives. Gaps between tokens are split by when they end: before
    the long prompt was sent, between its sending and its answer, or in the
    0.5 s after the answer (the streams alone again, but with the longer
    contexts they reached meanwhile: their steps cost more than before,
    prompt or not)."""
    client = Client(url)
    try:
        long_prompt = repeated_prompt(client, model, ' Once upon a time, there was a little girl named Lily.', o.long_prompt)
        # The streams could outlast the long prompt (up to the context); they
        # are ended once it has been answered.
        abort = Abort()
        results = [None] * 8

        def stream(i):
            results[i] = stream_once(Client(url), model, 'Once upon a time', o.long_prompt, abort)

        errors = []
        stream_functions = [lambda i=i: stream(i) for i in range(8)]
        streams = threading.Thread(target=_catch, args=(errors, in_threads, stream_functions), daemon=True)
        streams.start()
        time.sleep(0.5)
        long_sent = now_ms()
        long = stream_once(client, model, long_prompt, 1)
        long_done = long['arrivals'][0] if long['arrivals'] else now_ms()
        time.sleep(0.5)
        abort.abort()
        streams.join()
        if errors:
            raise errors[0]
        # Then a prompt of the same length alone (other tokens: no cached
        # blocks), for the ratio the pacing is judged by, once the server
        # has seen the streams' clients leave.
        time.sleep(0.3)
        alone_prompt = repeated_prompt(client, model, ' The sun was warm and the sky was blue over the quiet town.',
                                       o.long_prompt)
        alone = stream_once(client, model, alone_prompt, 1)
        alone_ttft = (alone['arrivals'][0] if alone['arrivals'] else now_ms()) - alone['sent']
    finally:
        client.close()
    before = []
    during = []
    after = []
    for r in results:
        a = r['arrivals']
        for i in range(1, len(a)):
            gap = a[i] - a[i - 1]
            if a[i] < long_sent:
                before.append(gap)
            elif a[i] <= long_done:
                during.append(gap)
            elif a[i - 1] > long_done:
                after.append(gap)
    return {'prompt_tokens': len(long_prompt), 'ttft': long_done - long_sent, 'alone_ttft': alone_ttft,
            'before99': percentile(before, 99), 'during99': percentile(during, 99),
            'before50': percentile(before, 50), 'during50': percentile(during, 50),
            'after50': percentile(after, 50), 'after99': percentile(after, 99),
            'before_n': len(before), 'during_n': len(during), 'after_n': len(after)}


def run(o, url):
    model = o.model_name
    if model is None and o.model:
        model = re.sub(r'\.gguf$', '', os.path.basename(o.model))
    warm_up = Client(url)
    stream_once(warm_up, model, 'Hello', 8)
    warm_up.close()
    print(f'server {url}, {o.tokens} tokens per request, {o.requests} requests per client\n')
    print('| clients | requests | generated tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms |')
    print('|---:|---:|---:|---:|---:|---:|---:|', flush=True)
    for clients in o.levels:
        r = concurrency_level(url, model, clients, o)
        print(f"| {clients} | {r['requests']} | {r['tps']:.0f} | {ms(r['ttft50'])} | {ms(r['ttft99'])} | "
              f"{ms(r['itl50'])} | {ms(r['itl99'])} |", flush=True)
    lp = long_prompt_during_streams(url, model, o)
    print(f"\n{lp['prompt_tokens']}-token prompt while 8 streams run: its first token after {ms(lp['ttft'])} ms "
          f"(alone: {ms(lp['alone_ttft'])} ms, {lp['ttft'] / lp['alone_ttft']:.2f}x)")
    print('| 8 streams | ITL p50 ms | ITL p99 ms | gaps |')
    print('|---|---:|---:|---:|')
    print(f"| before the long prompt | {ms(lp['before50'])} | {ms(lp['before99'])} | {lp['before_n']} |")
    print(f"| while it is read | {ms(lp['during50'])} | {ms(lp['during99'])} | {lp['during_n']} |")
    print(f"| 0.5 s after its answer | {ms(lp['after50'])} | {ms(lp['after99'])} | {lp['after_n']} |")


def main():
    o = parse_args(sys.argv[1:])

    # SIGTERM and SIGHUP end the script through the finally below (so the
    # server it started stops), as Ctrl-C's KeyboardInterrupt does.
    def exit_on(sig, _frame):
        sys.exit(128 + sig)

    signal.signal(signal.SIGTERM, exit_on)
    signal.signal(signal.SIGHUP, exit_on)
    server = None
    try:
        if o.url:
            url = o.url.rstrip('/')
        else:
            server = Server(o)
            url = server.wait_ready()
        run(o, url)
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        print(f'error: {e}', file=sys.stderr)
        return 1
    finally:
        if server is not None:
            server.stop()
    return 0


if __name__ == '__main__':
    sys.exit(main())
