import { llamaCppWaiting, useHealth } from '../health'

interface Props {
  /** What on this page needs llama.cpp, e.g. "Chat on the CPU needs llama.cpp". */
  title: string
  /** What can be done without it meanwhile. */
  meanwhile?: string
}

/** Where something needs llama.cpp and it is not ready yet (the first `./lanner up` builds it in the background). */
export function LlamaCppNotice({ title, meanwhile }: Props) {
  const status = llamaCppWaiting(useHealth())
  if (!status) return null
  return (
    <div className={`notice ${status.state === 'building' ? 'notice--warning' : 'notice--error'}`} role="status" data-testid="llama-cpp-notice">
      <span className="notice__title">{title}</span>
      <span>
        {status.detail}
        {status.log && status.state !== 'building' ? ` Log: ${status.log}` : ''}
      </span>
      {meanwhile && <span>{meanwhile}</span>}
    </div>
  )
}
