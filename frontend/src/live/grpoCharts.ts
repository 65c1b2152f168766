import type uPlot from 'uplot'
import type { MetricColumns } from './jobEvents'

/** One GRPO chart: its uPlot columns (time, then one per series) and the series' labels. */
export interface GrpoChart {
  key: string
  title: string
  labels: string[]
  data: uPlot.AlignedData
}

function num(value: unknown): number | null {
  return typeof value === 'number' && Number.isFinite(value) ? value : null
}

/** The reward functions a run logged (rewards/<name>/mean), in order of appearance. */
export function rewardFunctionNames(metrics: MetricColumns): string[] {
  const names = new Set<string>()
  for (const values of metrics.values) {
    for (const key of Object.keys(values)) {
      const match = /^rewards\/(.+)\/mean$/.exec(key)
      if (match) names.add(match[1]!)
    }
  }
  return [...names]
}

/**
 * GRPO's charts from the metric points (train steps only): the reward's mean and spread overall and
 * per function, the KL to the reference, the completion length, the share of groups with no reward
 * variance (no learning signal), and the step's time split. Empty when the run logged no reward.
 */
export function grpoCharts(metrics: MetricColumns): GrpoChart[] {
  const rows = metrics.values.map((values, i) => ({ t: metrics.t[i]!, values })).filter((r) => num(r.values.reward) != null)
  if (rows.length === 0) return []
  const t = rows.map((r) => r.t)
  const chart = (key: string, title: string, series: [string, string][]): GrpoChart => ({
    key, title, labels: series.map(([label]) => label),
    data: [t, ...series.map(([, field]) => rows.map((r) => num(r.values[field])))] as uPlot.AlignedData,
  })
  const names = rewardFunctionNames(metrics)
  return [
    chart('reward', 'Reward (weighted)', [['mean', 'reward'], ['std', 'reward_std']]),
    chart('per-function', 'Reward per function (mean)', names.map((n) => [n, `rewards/${n}/mean`])),
    chart('per-function-std', 'Reward per function (spread)', names.map((n) => [n, `rewards/${n}/std`])),
    chart('kl', 'KL to the reference', [['kl', 'kl']]),
    chart('length', 'Completion length (tokens)', [['mean', 'completions/mean_length'], ['min', 'completions/min_length'],
      ['max', 'completions/max_length']]),
    chart('zero-std', 'Groups with no reward variance', [['fraction', 'frac_reward_zero_std']]),
    chart('time', 'Step time split (s)', [['generation', 'generation_time'], ['rewards', 'reward_time'],
      ['training', 'training_time']]),
  ]
}
