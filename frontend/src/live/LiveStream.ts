import { UNAUTHORIZED_EVENT, wsUrl } from '../api'
import type { StreamEvent } from '../types'
import { compareStreamIds } from './streamIds'

export type StreamState = 'connecting' | 'open' | 'reconnecting' | 'closed'

export interface LiveStreamOptions {
  /** Path with no query, e.g. /ws/jobs/7. */
  path: string
  /** Where to start: "0-0" replays everything, "$" only new events. Reconnects use the last id seen. */
  after: string
  onEvents: (events: StreamEvent[]) => void
  onState?: (state: StreamState, detail?: string) => void
  /** Injected in tests. */
  createSocket?: (url: string) => WebSocket
  /** Milliseconds before reconnect attempt n (0-based); defaults to 0.5 s doubling up to 10 s. */
  backoff?: (attempt: number) => number
}

// Close codes of backend/routers/live.py: not signed in, no such job, bad `after`.
const CLOSE_UNAUTHORISED = 4401
const CLOSE_NOT_FOUND = 4404
const CLOSE_BAD_REQUEST = 4422

const defaultBackoff = (attempt: number) => Math.min(500 * 2 ** attempt, 10_000)

/**
 * One WebSocket stream of the API that survives drops: it remembers the id of the last event it
 * passed on and reconnects with ?after=<that id>, so the server replays exactly the gap. Events are
 * delivered in batches (one per animation-frame-sized burst of messages) and never twice, even if
 * the server repeats one.
 */
export class LiveStream {
  private socket: WebSocket | null = null
  private lastId: string | null = null
  private attempt = 0
  private stopped = false
  private timer: ReturnType<typeof setTimeout> | undefined
  private pending: StreamEvent[] = []
  private flushTimer: ReturnType<typeof setTimeout> | undefined
  private readonly options: LiveStreamOptions

  constructor(options: LiveStreamOptions) {
    this.options = options
    this.connect()
  }

  /** The id of the last event delivered (what a reconnect asks to continue after). */
  get lastEventId(): string | null {
    return this.lastId
  }

  close(): void {
    this.stopped = true
    clearTimeout(this.timer)
    clearTimeout(this.flushTimer)
    this.flush()
    if (this.socket) {
      this.socket.onclose = null
      this.socket.close()
    }
    this.socket = null
    this.options.onState?.('closed')
  }

  private connect(): void {
    const after = this.lastId ?? this.options.after
    const url = wsUrl(`${this.options.path}?after=${encodeURIComponent(after)}`)
    const create = this.options.createSocket ?? ((u: string) => new WebSocket(u))
    this.options.onState?.(this.attempt === 0 ? 'connecting' : 'reconnecting')
    const socket = create(url)
    this.socket = socket
    socket.onopen = () => {
      this.attempt = 0
      this.options.onState?.('open')
    }
    socket.onmessage = (message: MessageEvent) => {
      let event: StreamEvent
      try {
        event = JSON.parse(String(message.data)) as StreamEvent
      } catch {
        return
      }
      if (!event || typeof event.id !== 'string') return
      if (this.lastId && compareStreamIds(event.id, this.lastId) <= 0) return
      this.lastId = event.id
      this.pending.push(event)
      if (this.flushTimer === undefined) this.flushTimer = setTimeout(() => this.flush(), 50)
    }
    socket.onclose = (close: CloseEvent) => {
      this.flush()
      this.socket = null
      if (this.stopped) return
      if (close.code === CLOSE_UNAUTHORISED) {
        this.stopped = true
        window.dispatchEvent(new Event(UNAUTHORIZED_EVENT))
        this.options.onState?.('closed', 'Signed out')
        return
      }
      if (close.code === CLOSE_NOT_FOUND || close.code === CLOSE_BAD_REQUEST) {
        this.stopped = true
        this.options.onState?.('closed', close.reason || `Closed (${close.code})`)
        return
      }
      const delay = (this.options.backoff ?? defaultBackoff)(this.attempt)
      this.attempt += 1
      this.options.onState?.('reconnecting')
      this.timer = setTimeout(() => this.connect(), delay)
    }
  }

  private flush(): void {
    clearTimeout(this.flushTimer)
    this.flushTimer = undefined
    if (this.pending.length === 0) return
    const batch = this.pending
    this.pending = []
    this.options.onEvents(batch)
  }
}
