import { Field } from '../components/Field'
import type { Sampling } from './types'

interface Props {
  system: string
  onSystem: (value: string) => void
  sampling: Sampling
  onSampling: (value: Sampling) => void
}

function numberOr(value: string, fallback: number): number {
  const parsed = Number(value)
  return Number.isFinite(parsed) ? parsed : fallback
}

/** The system prompt and the sampling settings sent with each question. */
export function SamplingForm({ system, onSystem, sampling, onSampling }: Props) {
  return (
    <div className="playground-settings">
      <Field label="System prompt" help="Sent first in every conversation; empty: the chat template's default.">
        <textarea rows={3} value={system} onChange={(event) => onSystem(event.target.value)} />
      </Field>
      <div className="field-grid">
        <Field label="Temperature" help="0 always picks the likeliest token.">
          <input
            type="number"
            min={0}
            max={2}
            step={0.05}
            value={sampling.temperature}
            onChange={(event) => onSampling({ ...sampling, temperature: numberOr(event.target.value, 0.7) })}
          />
        </Field>
        <Field label="Top-p" help="Sample from the smallest set of tokens with this much probability.">
          <input
            type="number"
            min={0.01}
            max={1}
            step={0.05}
            value={sampling.top_p}
            onChange={(event) => onSampling({ ...sampling, top_p: numberOr(event.target.value, 0.95) })}
          />
        </Field>
        <Field label="Max tokens" help="The longest answer.">
          <input
            type="number"
            min={1}
            max={4096}
            step={1}
            value={sampling.max_tokens}
            onChange={(event) => onSampling({ ...sampling, max_tokens: Math.round(numberOr(event.target.value, 256)) })}
          />
        </Field>
        <Field label="Stop strings" help="One per line; the answer ends before any of them.">
          <textarea
            rows={2}
            value={sampling.stop.join('\n')}
            onChange={(event) => onSampling({ ...sampling, stop: event.target.value.split('\n') })}
          />
        </Field>
      </div>
    </div>
  )
}
