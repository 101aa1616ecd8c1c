// Starts `m40-llm serve` on a free loopback port for the client tests, and
// runs `m40-llm run` for the answers the server must match.
import { spawn, execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, '../../..');

export const binary = process.env.M40_LLM_BINARY ?? path.join(root, 'build', 'm40-llm');
export const sharedDir = process.env.M40_SHARED_DIR ?? path.resolve(root, '../shared');
export const modelPath = path.join(sharedDir, 'models', 'TinyStories-656K-Q8_0.gguf');
// The API name of a model served from a file: its name without .gguf.
export const modelName = 'TinyStories-656K-Q8_0';

// What `m40-llm run` answers, greedy, without the newline it ends with.
export function runAnswer(prompt, { maxTokens, raw = false, stop = [] }) {
  const args = ['run', modelPath, prompt, '--cpu', '--threads', '2', '--temp', '0', '--repeat-penalty', '1',
                '-n', String(maxTokens)];
  if (raw) args.push('--raw');
  for (const s of stop) args.push('--stop', s);
  const out = execFileSync(binary, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
  return out.endsWith('\n') ? out.slice(0, -1) : out;
}

// Resolves to { url, port, stop() } once the server has printed "ready".
export function startServer(extraArgs = []) {
  const home = mkdtempSync(path.join(tmpdir(), 'm40-clients-'));
  // --allow-paths: the Ollama client test pulls the shared model by its path.
  // --ctx 256 unless the caller gives its own.
  const ctx = extraArgs.includes('--ctx') ? [] : ['--ctx', '256'];
  const child = spawn(binary, ['serve', modelPath, '--port', '0', '--cpu', '--threads', '2', '--parallel', '2',
                               ...ctx, '--allow-paths', ...extraArgs],
                      { env: { ...process.env, M40_LLM_HOME: home }, stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => { child.kill('SIGKILL'); reject(new Error(`serve did not start:\n${log}`)); }, 30000);
    child.on('exit', (code) => { clearTimeout(timer); reject(new Error(`serve exited with ${code}:\n${log}`)); });
    child.stderr.on('data', (chunk) => {
      log += chunk;
      const port = /listening on http:\/\/127\.0\.0\.1:(\d+)/.exec(log)?.[1];
      if (port && /m40-llm: ready/.test(log)) {
        clearTimeout(timer);
        child.removeAllListeners('exit');
        resolve({
          port: Number(port),
          url: `http://127.0.0.1:${port}`,
          home,
          stop: () => new Promise((done) => {
            child.on('exit', (code) => { rmSync(home, { recursive: true, force: true }); done(code); });
            child.kill('SIGTERM');
          }),
        });
      }
    });
  });
}
