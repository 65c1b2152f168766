import type uPlot from 'uplot'
import type { MetricColumns } from './jobEvents'

function num(value: unknown): number | null {
  return typeof value === 'number' && Number.isFinite(value) ? value : null
}

/** The share of held-out pairs whose chosen answer scored above the rejected one, at the newest evaluation. */
export function heldOutAccuracy(metrics: MetricColumns): { step: number; accuracy: number } | null {
  for (let i = metrics.values.length - 1; i >= 0; i--) {
    const accuracy = num(metrics.values[i]!.eval_accuracy)
    if (accuracy != null) return { step: metrics.step[i]!, accuracy }
  }
  return null
}

/** A reward model's pair accuracy over time: the training batches' and the held-out pairs'. */
export function accuracyData(metrics: MetricColumns): uPlot.AlignedData {
  return [metrics.t, metrics.values.map((v) => num(v.accuracy)), metrics.values.map((v) => num(v.eval_accuracy))] as uPlot.AlignedData
}
