import { formatFloat } from '../format'

/** The figures worth showing from an export's check, in this order, with their names in words. */
const FIGURES: [string, string][] = [
  ['mean_kl', 'mean KL (nats)'],
  ['top1_agreement', 'top-1 agreement'],
  ['top1_mismatches', 'top-1 mismatches'],
  ['top1_mismatches_near_ties', '…of them near-ties'],
  ['max_abs_logit_diff', 'max |logit diff|'],
  ['noise_floor_max_abs_logit_diff', '16-bit noise floor'],
  ['positions', 'positions compared'],
]

function shown(value: unknown): string {
  if (typeof value === 'number') return formatFloat(value)
  if (typeof value === 'boolean') return value ? 'yes' : 'no'
  return String(value)
}

/** An export check: passed or failed, what it compared, and its figures. */
export function VerificationResult({ verification }: { verification: Record<string, unknown> }) {
  const passed = verification.passed
  const label = passed === true ? 'verified' : passed === false ? 'verification failed' : 'checked'
  const figures = FIGURES.filter(([key]) => verification[key] !== undefined && verification[key] !== null)
  return (
    <details className="verification" data-testid="verification">
      <summary>
        <span className={`badge badge--${passed === false ? 'failed' : passed === true ? 'succeeded' : 'muted'}`}>{label}</span>
        {typeof verification.check === 'string' && <span className="muted small"> {verification.check}</span>}
      </summary>
      <dl className="facts facts--row small">
        {figures.map(([key, name]) => (
          <div key={key}><dt>{name}</dt><dd className="mono">{shown(verification[key])}</dd></div>
        ))}
        {typeof verification.generated === 'string' && (
          <div className="verification__sample"><dt>sample generation</dt><dd className="mono">{verification.generated}</dd></div>
        )}
      </dl>
    </details>
  )
}
