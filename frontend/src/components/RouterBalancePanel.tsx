import { useMemo } from 'react'
import { clock, formatFloat } from '../format'
import type { MetricColumns } from '../live/jobEvents'
import { routerBalanceData } from '../live/routerCharts'
import { LiveChart } from './LiveChart'

const SERIES = [
  { label: 'aux loss', color: '#2f6fde' },
  { label: 'busiest expert / mean', color: '#d9822b' },
]

/** A mixture of experts' router load balance per step; nothing for a dense model's job. */
export function RouterBalancePanel({ metrics, jobId, xDomain }: { metrics: MetricColumns; jobId: string; xDomain: [number, number] }) {
  const data = useMemo(() => routerBalanceData(metrics), [metrics])
  if (!data) return null
  return (
    <section className="panel" aria-labelledby="router-balance-heading" data-testid="router-balance-panel">
      <header className="panel__header"><h2 id="router-balance-heading">Experts’ load balance</h2></header>
      <div className="panel__body">
        <p className="muted small">
          How evenly the routers spread each step’s tokens over the experts, averaged over the MoE layers; both are 1
          when every expert gets the same share. Aux loss: the Switch Transformer’s load-balancing loss (experts × the
          sum of each expert’s token share times its mean router probability). Busiest expert / mean: the most loaded
          expert’s share over the even share; at most experts ÷ top-k, when the same top-k experts take every token.
        </p>
        <LiveChart title="Router load balance" testId="chart-router-balance" data={data} series={SERIES}
          xLabel="time" xFormat={clock} yFormat={formatFloat} syncKey={`job-${jobId}`} xDomain={xDomain} />
      </div>
    </section>
  )
}
