import { useState } from 'react'
import { postJson } from '../api'
import { formatFloat } from '../format'
import type { JobPage, RewardFunction, RewardTestResult } from '../types'
import { useResource } from '../useResource'
import { errorText, Field } from './Field'

type Kind = RewardFunction['kind']

const KINDS: { value: Kind; label: string; help: string }[] = [
  { value: 'exact_match', label: 'Exact match', help: '1 when the completion is the reference column’s value (case and spaces ignored).' },
  { value: 'numeric_match', label: 'Numeric match', help: '1 when the completion’s last number is the reference’s.' },
  { value: 'regex', label: 'Format (regex)', help: '1 when the pattern matches the completion (anchor with ^ and $).' },
  { value: 'length_penalty', label: 'Length penalty', help: '0 up to the length, down to -1 at twice it.' },
  { value: 'json_schema', label: 'JSON schema', help: '1 for JSON that fits the schema, 0.5 for other JSON, 0 otherwise.' },
  { value: 'python', label: 'Python', help: 'Your reward(prompts, completions, **columns): one number per completion. Runs in a sandbox.' },
  { value: 'reward_model', label: 'A trained reward model', help: 'A succeeded reward job’s model scores each prompt and completion, on the training device.' },
]
const STARTERS: Record<Kind, RewardFunction> = {
  exact_match: { kind: 'exact_match', column: 'answer' },
  numeric_match: { kind: 'numeric_match', column: 'answer' },
  regex: { kind: 'regex', pattern: '^<think>.*</think>' },
  length_penalty: { kind: 'length_penalty', max_chars: 800 },
  json_schema: { kind: 'json_schema', json_schema: { type: 'object' } },
  python: { kind: 'python', source: 'def reward(prompts, completions, answer, **columns):\n    return [1.0 if a in c else 0.0 for c, a in zip(completions, answer)]\n' },
  reward_model: { kind: 'reward_model' },
}
/** Completions to test are written one after another, a line of three dashes apart. */
const SEPARATOR = /\n-{3,}\n/

/** GRPO's reward functions in the new-job form, and a button that tries them in the server's sandbox. */
export function RewardFunctionsEditor({ functions, onChange, datasetId, error }: {
  functions: RewardFunction[]
  onChange: (next: RewardFunction[]) => void
  datasetId: string
  error?: string
}) {
  const [samples, setSamples] = useState('The answer is 4.\n---\n<think>2 + 2</think> 4')
  const [result, setResult] = useState<RewardTestResult | null>(null)
  const [testError, setTestError] = useState<string | null>(null)
  const [testing, setTesting] = useState(false)
  const [schemaTexts, setSchemaTexts] = useState<Record<number, string>>({})
  const usesRewardModel = functions.some((f) => f.kind === 'reward_model')
  const rewardJobs = useResource<JobPage>(usesRewardModel ? '/api/jobs?method=reward&status=succeeded&limit=100' : null)
  // A reward model scores in the training process only: the test runs the other functions.
  const tried = functions.filter((f) => f.kind !== 'reward_model')

  function change(index: number, patch: Partial<RewardFunction>) {
    onChange(functions.map((f, i) => (i === index ? { ...f, ...patch } : f)))
  }

  async function test() {
    setTesting(true)
    setTestError(null)
    try {
      const completions = samples.split(SEPARATOR).map((s) => s.trim()).filter(Boolean)
      setResult(await postJson<RewardTestResult>('/api/rewards/test', {
        reward_functions: tried, completions, ...(datasetId ? { dataset_id: Number(datasetId) } : {}),
      }))
    } catch (err) {
      setResult(null)
      setTestError(errorText(err))
    } finally {
      setTesting(false)
    }
  }

  const labels = functions.map((f) => f.name || f.kind)
  const triedLabels = tried.map((f) => f.name || f.kind)
  return (
    <div className="reward-functions" data-testid="reward-functions">
      <h3>Reward functions</h3>
      {error && <p className="error-text" role="alert">{error}</p>}
      {functions.map((f, index) => (
        <fieldset key={index} className="panel panel__body form__body">
          <legend>{labels[index]}</legend>
          <div className="field-grid">
            <Field label="Kind" help={KINDS.find((k) => k.value === f.kind)?.help ?? ''}>
              <select aria-label={`Kind of reward ${index + 1}`} value={f.kind}
                onChange={(e) => onChange(functions.map((g, i) => (i === index ? { ...STARTERS[e.target.value as Kind], name: g.name, weight: g.weight } : g)))}>
                {KINDS.map((k) => <option key={k.value} value={k.value}>{k.label}</option>)}
              </select>
            </Field>
            <Field label="Name" help="Its label on the charts (letters, digits, _).">
              <input type="text" value={f.name ?? ''} placeholder={f.kind} onChange={(e) => change(index, { name: e.target.value || null })} />
            </Field>
            <Field label="Weight" help="Its share of the reward.">
              <input type="text" inputMode="decimal" value={String(f.weight ?? 1)} onChange={(e) => change(index, { weight: Number(e.target.value) })} />
            </Field>
            {(f.kind === 'exact_match' || f.kind === 'numeric_match') && (
              <Field label="Reference column" help="The dataset’s column with the expected answer.">
                <input type="text" value={f.column ?? ''} onChange={(e) => change(index, { column: e.target.value || null })} />
              </Field>
            )}
            {f.kind === 'regex' && (
              <Field label="Pattern" help="A Python regular expression; dot matches newlines.">
                <input type="text" className="mono" value={f.pattern ?? ''} onChange={(e) => change(index, { pattern: e.target.value })} />
              </Field>
            )}
            {f.kind === 'reward_model' && (
              <Field label="Reward job" help="A succeeded reward job (method Reward model); its scores are added with this weight.">
                <select aria-label={`Reward job of reward ${index + 1}`} value={f.job_id ?? ''}
                  onChange={(e) => change(index, { job_id: e.target.value ? Number(e.target.value) : null })}>
                  <option value="">{rewardJobs.data?.items.length === 0 ? 'No succeeded reward job yet' : 'Choose a reward job'}</option>
                  {rewardJobs.data?.items.map((job) => <option key={job.id} value={job.id}>#{job.id} {job.name}</option>)}
                </select>
              </Field>
            )}
            {f.kind === 'length_penalty' && (
              <Field label="Max characters" help="No penalty up to this many characters.">
                <input type="text" inputMode="numeric" value={String(f.max_chars ?? '')} onChange={(e) => change(index, { max_chars: Number(e.target.value) })} />
              </Field>
            )}
          </div>
          {f.kind === 'json_schema' && (
            <Field label="Schema (JSON)" help="type, properties, required, items, enum, additionalProperties.">
              <textarea className="mono" rows={4} value={schemaTexts[index] ?? JSON.stringify(f.json_schema ?? {}, null, 2)}
                onChange={(e) => {
                  setSchemaTexts((t) => ({ ...t, [index]: e.target.value }))
                  try { change(index, { json_schema: JSON.parse(e.target.value) }) } catch { /* kept as text until it parses */ }
                }} />
            </Field>
          )}
          {f.kind === 'python' && (
            <Field label="Code" help="Define reward(prompts, completions, **columns); the dataset’s columns arrive by name. Standard library only; no network; time and memory limits.">
              <textarea className="mono" rows={8} spellCheck={false} aria-label={`Code of reward ${index + 1}`} value={f.source ?? ''}
                onChange={(e) => change(index, { source: e.target.value })} />
            </Field>
          )}
          <button type="button" className="button" onClick={() => onChange(functions.filter((_, i) => i !== index))}>Remove</button>
        </fieldset>
      ))}
      <div className="form__actions">
        <button type="button" className="button" disabled={functions.length >= 8}
          onClick={() => onChange([...functions, { ...STARTERS.regex, name: `reward_${functions.length + 1}` }])}>Add a reward function</button>
      </div>
      <Field label="Sample completions" help="Completions to try the functions on, a line of --- apart; each is paired with a row of the chosen dataset (its prompt and reference columns).">
        <textarea className="mono" rows={4} aria-label="Sample completions" value={samples} onChange={(e) => setSamples(e.target.value)} />
      </Field>
      <div className="form__actions">
        <button type="button" className="button" disabled={testing || tried.length === 0} onClick={() => void test()}>
          {testing ? 'Testing…' : 'Test rewards'}
        </button>
        {usesRewardModel && <span className="muted small">Reward models are not tried here: they score in the training process.</span>}
        {result && !result.network_isolated && <span className="muted small">This server cannot cut the sandbox off the network; only Python’s guards refuse it.</span>}
      </div>
      {testError && <p className="error-text" role="alert">{testError}</p>}
      {result?.failure && (
        <div className="error-text" role="alert" data-testid="reward-test-failure">
          <p>{result.failure.function ? `Reward function ${result.failure.function}: ` : ''}{result.failure.message}</p>
          <pre className="log">{[result.failure.traceback, result.failure.output].filter(Boolean).join('\n')}</pre>
        </div>
      )}
      {result && !result.failure && (
        <table className="table" data-testid="reward-test-rows">
          <thead><tr><th>Prompt</th><th>Completion</th>{triedLabels.map((l) => <th key={l}>{l}</th>)}<th>Total</th></tr></thead>
          <tbody>
            {result.rows.map((row, i) => (
              <tr key={i}>
                <td className="pre-wrap">{row.prompt}</td>
                <td className="pre-wrap mono">{row.completion}</td>
                {triedLabels.map((l) => <td key={l} className="mono">{row.rewards[l] == null ? '—' : formatFloat(row.rewards[l]!)}</td>)}
                <td className="mono">{row.total == null ? '—' : formatFloat(row.total)}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </div>
  )
}
