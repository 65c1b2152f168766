import type { SideState } from './conversation'
import type { ModelFile, Side } from './types'

const TITLES: Record<Side, string> = { tuned: 'Fine-tuned', base: 'Base model' }
const ACTIVITY: Record<string, string> = {
  loading: 'Loading the model…',
  waiting: 'Waiting: the model is answering someone else…',
  generating: 'Answering…',
}
const FINISH: Record<string, string> = {
  stop: 'finished',
  length: 'stopped at the token limit',
  stopped: 'generation stopped',
}

/** One model's side of the chat: its conversation, the streaming answer, and what went wrong. */
export function ChatColumn({ side, state, file }: { side: Side; state: SideState; file: ModelFile | null }) {
  return (
    <section className="panel playground-column" aria-label={`${TITLES[side]} chat`} data-testid={`chat-${side}`}>
      <div className="panel__header">
        <h2>{TITLES[side]}</h2>
        <span className="muted small mono">{file?.gguf ?? ''}</span>
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
            {ACTIVITY[state.activity]}
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
