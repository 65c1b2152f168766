import type { SideState } from './conversation'
import type { Side } from './types'

const TITLES: Record<Side, string> = { tuned: 'Fine-tuned', base: 'Base model' }
const ACTIVITY: Record<string, string> = {
  queued: 'Waiting for a GPU in the queue…',
  loading: 'Loading the model…',
  waiting: 'Waiting: the model is answering someone else…',
  generating: 'Answering…',
}
const FINISH: Record<string, string> = {
  stop: 'finished',
  length: 'stopped at the token limit',
  stopped: 'generation stopped',
}

function activityText(state: SideState): string {
  if (state.activity === 'queued' && state.queuePosition != null) {
    return `Waiting for a GPU: number ${state.queuePosition} in the queue…`
  }
  return ACTIVITY[state.activity] ?? ''
}

/** One model's side of the chat: its conversation, the streaming answer, and what went wrong.
 * `source` names what answers (the GGUF file, or the GPU session). */
export function ChatColumn({ side, state, source }: { side: Side; state: SideState; source: string }) {
  return (
    <section className="panel playground-column" aria-label={`${TITLES[side]} chat`} data-testid={`chat-${side}`}>
      <div className="panel__header">
        <h2>{TITLES[side]}</h2>
        <span className="muted small mono">{source}</span>
      </div>
      <div className="panel__body playground-messages" aria-live="polite">
        {state.messages.length === 0 && <p className="muted">Nothing asked yet.</p>}
        {state.messages.map((message, index) => (
          <div key={index} className={`playground-message playground-message--${message.role}`}>
            <span className="playground-message__who">{message.role === 'user' ? 'You' : TITLES[side]}</span>
            <p data-testid={message.role === 'assistant' ? `answer-${side}` : undefined}>{message.content}</p>
          </div>
        ))}
        {state.activity !== 'idle' && (
          <p className="muted small" data-testid={`activity-${side}`}>
            {activityText(state)}
          </p>
        )}
        {state.activity === 'idle' && state.finish && (
          <p className="muted small" data-testid={`finish-${side}`}>
            {FINISH[state.finish] ?? state.finish}
            {state.seconds != null && ` · ${state.chunks} tokens in ${state.seconds.toFixed(1)} s`}
          </p>
        )}
        {state.error && (
          <div className="notice notice--error" role="alert">
            <p>{state.error}</p>
          </div>
        )}
      </div>
    </section>
  )
}
