import { useMemo } from 'react'
import { clock, formatFloat } from '../format'
import type { MetricColumns } from '../live/jobEvents'
import { accuracyData, heldOutAccuracy } from '../live/rewardModelCharts'
import { LiveChart } from './LiveChart'

const SERIES = [
  { label: 'training pairs', color: '#2f6fde' },
  { label: 'held-out pairs', color: '#d9822b', spanGaps: true, points: true },
]

/** A reward job's accuracy: the share of pairs it scores the right way round (chosen above rejected). */
export function RewardModelPanel({ metrics, jobId, xDomain }: { metrics: MetricColumns; jobId: string; xDomain: [number, number] }) {
  const heldOut = heldOutAccuracy(metrics)
  const data = useMemo(() => accuracyData(metrics), [metrics])
  return (
    <section className="panel" aria-labelledby="reward-model-heading" data-testid="reward-model-panel">
      <header className="panel__header"><h2 id="reward-model-heading">Reward model</h2></header>
      <div className="panel__body">
        <dl className="facts facts--row">
          <div><dt>Held-out accuracy</dt><dd className="mono" data-testid="held-out-accuracy">
            {heldOut ? `${(heldOut.accuracy * 100).toFixed(1)} % (step ${heldOut.step})` : '—'}</dd></div>
        </dl>
        {!heldOut && <p className="muted small">Measured on the held-out pairs: set an evaluation share (20 pairs or more).</p>}
        <LiveChart title="Pairs scored the right way round" testId="chart-reward-accuracy" data={data} series={SERIES}
          xLabel="time" xFormat={clock} yFormat={formatFloat} syncKey={`job-${jobId}`} xDomain={xDomain} yDomain={[0, 1]} />
      </div>
    </section>
  )
}
