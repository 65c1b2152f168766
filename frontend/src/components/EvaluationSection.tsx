import { useEffect, useState } from 'react'
import { fetchEvaluation, formatChange, relativeChange } from '../evaluation'
import { formatFloat } from '../format'
import type { Evaluation } from '../types'
import { errorText } from './Field'

const POLL_MS = 5000

/**
 * The trained model against its base on held-out prompts: eval loss before and after, the answers
 * side by side with their overlap with the reference. Hidden when the job has no evaluation.
 */
export function EvaluationSection({ jobId, refresh }: { jobId: string | number; refresh?: unknown }) {
  const [evaluation, setEvaluation] = useState<Evaluation | null>(null)
  const [error, setError] = useState<string | null>(null)

  useEffect(() => {
    const abort = new AbortController()
    let timer: ReturnType<typeof setTimeout> | undefined
    const load = () => {
      fetchEvaluation(jobId, abort.signal)
        .then((found) => {
          setEvaluation(found)
          setError(null)
          if (found?.status === 'running') timer = setTimeout(load, POLL_MS)
        })
        .catch((err) => {
          if (!abort.signal.aborted) setError(errorText(err))
        })
    }
    load()
    return () => {
      abort.abort()
      clearTimeout(timer)
    }
  }, [jobId, refresh])

  if (!evaluation && !error) return null
  return (
    <section className="panel" aria-labelledby="evaluation-heading" data-testid="evaluation">
      <header className="panel__header">
        <h2 id="evaluation-heading">Before and after</h2>
        {evaluation && <span className={`badge badge--${evaluation.status === 'done' ? 'succeeded' : evaluation.status}`}>{evaluation.status === 'done' ? 'evaluated' : evaluation.status}</span>}
      </header>
      <div className="panel__body">
        {error && <p className="error-text">Could not load the evaluation: {error}</p>}
        {evaluation?.status === 'running' && <p className="muted">The base and the trained model are answering the held-out prompts…</p>}
        {evaluation?.status === 'failed' && <p className="error-text">The evaluation failed: {evaluation.error ?? 'no reason given'}</p>}
        {evaluation && <EvaluationFigures evaluation={evaluation} />}
        {evaluation && evaluation.samples.length > 0 && (
          <div className="table-scroll">
            <table className="table table--compact evaluation__samples" aria-label="Answers before and after training">
              <thead>
                <tr><th scope="col">Prompt</th><th scope="col">Reference</th><th scope="col">Base model</th><th scope="col">Trained model</th></tr>
              </thead>
              <tbody>
                {evaluation.samples.map((s, i) => (
                  <tr key={i}>
                    <td className="pre">{s.prompt}</td>
                    <td className="pre">{s.reference}</td>
                    <td className="pre">{s.base_answer}<div className="muted small mono">overlap {formatFloat(s.base_overlap)}</div></td>
                    <td className="pre">{s.tuned_answer}<div className="muted small mono">overlap {formatFloat(s.tuned_overlap)}</div></td>
                  </tr>
                ))}
              </tbody>
            </table>
          </div>
        )}
      </div>
    </section>
  )
}

/** Eval loss and overlap, base → trained, with the change. */
export function EvaluationFigures({ evaluation }: { evaluation: Evaluation }) {
  const loss = relativeChange(evaluation.base_eval_loss, evaluation.tuned_eval_loss)
  const overlap = relativeChange(evaluation.scores?.base_overlap, evaluation.scores?.tuned_overlap)
  return (
    <dl className="facts facts--row" data-testid="evaluation-figures">
      <div><dt>Eval loss, base</dt><dd className="mono">{formatFloat(evaluation.base_eval_loss)}</dd></div>
      <div><dt>Eval loss, trained</dt><dd className="mono">{formatFloat(evaluation.tuned_eval_loss)}</dd></div>
      <div><dt>Change</dt><dd className={`mono ${loss != null && loss < 0 ? 'good' : ''}`}>{formatChange(loss)}</dd></div>
      <div><dt>Overlap with reference, base</dt><dd className="mono">{formatFloat(evaluation.scores?.base_overlap)}</dd></div>
      <div><dt>Overlap, trained</dt><dd className="mono">{formatFloat(evaluation.scores?.tuned_overlap)}</dd></div>
      <div><dt>Change</dt><dd className={`mono ${overlap != null && overlap > 0 ? 'good' : ''}`}>{formatChange(overlap)}</dd></div>
    </dl>
  )
}
