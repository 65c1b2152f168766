import { useMemo } from 'react'
import { clock, formatFloat } from '../format'
import { grpoCharts } from '../live/grpoCharts'
import type { MetricColumns } from '../live/jobEvents'
import type { CompletionSamples } from '../types'
import { LiveChart } from './LiveChart'

const COLORS = ['#2f6fde', '#d9822b', '#1f9d63', '#c2417a', '#7a4fd6', '#0f8b8d', '#8a94a3', '#d64545']

function reward(value: number | null | undefined): string {
  return value == null ? '—' : formatFloat(value)
}

/** A GRPO job's reward charts and its sampled completions, newest step first. */
export function GrpoPanel({ metrics, completions, jobId, xDomain }: {
  metrics: MetricColumns
  completions: CompletionSamples[]
  jobId: string
  xDomain: [number, number]
}) {
  const charts = useMemo(() => grpoCharts(metrics), [metrics])
  const names = [...new Set(completions.flatMap((c) => c.samples.flatMap((s) => Object.keys(s.rewards))))]
  return (
    <section className="panel" aria-labelledby="grpo-heading" data-testid="grpo-panel">
      <header className="panel__header"><h2 id="grpo-heading">Rewards</h2></header>
      <div className="panel__body">
        {charts.length === 0 && <p className="muted">No reward logged yet.</p>}
        <div className="grid grid--charts">
          {charts.map((c) => (
            <LiveChart key={c.key} title={c.title} testId={`chart-grpo-${c.key}`} data={c.data} xLabel="time" xFormat={clock}
              series={c.labels.map((label, i) => ({ label, color: COLORS[i % COLORS.length]! }))}
              yFormat={formatFloat} syncKey={`job-${jobId}`} xDomain={xDomain} />
          ))}
        </div>
        <h3>Sampled completions</h3>
        {completions.length === 0 ? <p className="muted">No completions sampled yet.</p> : (
          <div className="table-wrap">
            <table className="table" data-testid="grpo-completions">
              <thead>
                <tr><th>Step</th><th>Prompt</th><th>Completion</th>{names.map((n) => <th key={n}>{n}</th>)}<th>Advantage</th></tr>
              </thead>
              <tbody>
                {[...completions].reverse().flatMap((c) => c.samples.map((s, i) => (
                  <tr key={`${c.step}-${i}`}>
                    <td className="mono">{c.step}</td>
                    <td className="pre-wrap">{s.prompt}</td>
                    <td className="pre-wrap mono">{s.completion}</td>
                    {names.map((n) => <td key={n} className="mono">{reward(s.rewards[n])}</td>)}
                    <td className="mono">{reward(s.advantage)}</td>
                  </tr>
                )))}
              </tbody>
            </table>
          </div>
        )}
      </div>
    </section>
  )
}
