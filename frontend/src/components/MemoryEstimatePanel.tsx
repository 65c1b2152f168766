import { useEffect, useState } from 'react'
import { postJson } from '../api'
import { formatGiB, formatParameters } from '../format'
import { useHealth } from '../health'
import { buildJobSpec, validateJobForm, type JobForm } from '../jobForm'
import { deviceFits } from '../memoryFit'
import type { MemoryEstimate } from '../types'
import { errorText } from './Field'

const DEBOUNCE_MS = 400
const PARTS: [string, string][] = [
  ['weights_bytes', 'weights (+ adapter)'],
  ['gradients_bytes', 'gradients'],
  ['optimizer_bytes', 'optimizer state'],
  ['activations_bytes', 'activations'],
  ['logits_bytes', 'logits'],
  ['generation_bytes', 'generation (KV cache; GRPO, in turn with activations)'],
  ['reward_models_bytes', 'reward models'],
  ['overhead_bytes', 'overhead'],
]
// Parts only a GRPO job has: left out at 0.
const GRPO_PARTS = new Set(['generation_bytes', 'reward_models_bytes'])

/**
 * The device memory the chosen settings need (POST /api/jobs/estimate), and whether that fits each
 * worker's device (from /api/health). Asked again, debounced, whenever the settings change. onExperts
 * hears the model's routed experts per MoE layer from each answer (0: dense; null: its shape is unknown).
 */
export function MemoryEstimatePanel({ form, onExperts }: { form: JobForm; onExperts?: (experts: number | null) => void }) {
  const health = useHealth()
  const [answer, setAnswer] = useState<MemoryEstimate | null>(null)
  const [error, setError] = useState<string | null>(null)
  const [pending, setPending] = useState(false)
  // The estimate needs no dataset; any id passes the spec's check (the server does not look it up).
  const problems = Object.keys(validateJobForm({ ...form, datasetId: form.datasetId || '1' }))
  const spec = problems.length === 0 ? JSON.stringify({ ...buildJobSpec({ ...form, datasetId: form.datasetId || '1', name: '' }) }) : null

  useEffect(() => {
    if (!spec) return
    const abort = new AbortController()
    setPending(true)
    const timer = setTimeout(() => {
      postJson<MemoryEstimate>('/api/jobs/estimate', JSON.parse(spec), abort.signal)
        .then((a) => {
          setAnswer(a)
          setError(null)
          onExperts?.(a.estimate?.experts ?? null)
        })
        .catch((err) => {
          if (!abort.signal.aborted) setError(errorText(err))
        })
        .finally(() => {
          if (!abort.signal.aborted) setPending(false)
        })
    }, DEBOUNCE_MS)
    return () => {
      abort.abort()
      clearTimeout(timer)
    }
  }, [spec])

  const estimate = answer?.estimate ?? null
  const fits = deviceFits(estimate?.total_bytes ?? null, answer?.device ?? 'cuda', health.health?.workers ?? [])
  return (
    <section className="estimate" aria-label="Memory estimate" data-testid="memory-estimate" aria-busy={pending}>
      <h3 className="report__title">Memory estimate {pending && <span className="muted small">(updating…)</span>}</h3>
      {!spec && <p className="muted small">Choose a model and valid settings to see how much memory they need.</p>}
      {error && <p className="error-text small">Could not estimate the memory: {error}</p>}
      {spec && answer && !estimate && <p className="muted small">No estimate for {answer.model}: its size is not known on this server (it may still run).</p>}
      {estimate && (
        <>
          <p>
            <strong className="mono" data-testid="estimate-total">{formatGiB(estimate.total_bytes)}</strong>{' '}
            on {answer?.device === 'cpu' ? 'the CPU' : 'each GPU'}
            {estimate.parameters ? <span className="muted small"> · {formatParameters(estimate.parameters)} parameters, {formatParameters(estimate.trainable_parameters ?? 0)} trained</span> : null}
          </p>
          <dl className="facts facts--row small">
            {PARTS.filter(([key]) => typeof estimate[key] === 'number' && !(GRPO_PARTS.has(key) && estimate[key] === 0)).map(([key, label]) => (
              <div key={key}><dt>{label}</dt><dd className="mono">{formatGiB(estimate[key])}</dd></div>
            ))}
          </dl>
        </>
      )}
      {estimate && (fits.length === 0 ? <p className="muted small">No worker is connected, so no device to check against.</p> : (
        <table className="table table--compact" aria-label="Fits each device" data-testid="estimate-fits">
          <thead><tr><th scope="col">Worker</th><th scope="col">Device</th><th scope="col" className="num">Memory</th><th scope="col">Fits?</th></tr></thead>
          <tbody>
            {fits.map((f) => (
              <tr key={f.worker}>
                <td className="mono">{f.worker}</td>
                <td>{f.device}</td>
                <td className="num mono">{formatGiB(f.totalBytes)}</td>
                <td>
                  {f.fits === null ? <span className="muted">{f.kind !== answer?.device ? `not a ${answer?.device === 'cpu' ? 'CPU' : 'GPU'} worker` : 'unknown'}</span>
                    : f.fits ? <span className="badge badge--succeeded">fits ({Math.round(f.share! * 100)} %)</span>
                      : <span className="badge badge--failed">does not fit ({Math.round(f.share! * 100)} %)</span>}
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      ))}
    </section>
  )
}
