import type uPlot from 'uplot'
import type { MetricColumns } from './jobEvents'

function num(value: unknown): number | null {
  return typeof value === 'number' && Number.isFinite(value) ? value : null
}

/**
 * A mixture of experts' router load balance per step (lanner.worker.training.router_balance), on the
 * time axis: the Switch load-balancing loss and the busiest expert's share of the routed tokens over
 * the mean share, each averaged over the MoE layers; both 1 when the routing is even. Null for a job
 * whose steps carry neither (a dense model).
 */
export function routerBalanceData(metrics: MetricColumns): uPlot.AlignedData | null {
  const aux = metrics.values.map((v) => num(v.router_aux_loss))
  const maxLoad = metrics.values.map((v) => num(v.router_max_load))
  if (aux.every((v) => v == null) && maxLoad.every((v) => v == null)) return null
  return [metrics.t, aux, maxLoad] as uPlot.AlignedData
}
