import type { ChatMessage, ServerMessage, Side } from './types'

export type SideActivity = 'idle' | 'queued' | 'loading' | 'waiting' | 'generating'

export interface SideState {
  messages: ChatMessage[]
  activity: SideActivity
  /** Why the last answer did not come, in the server's words. */
  error: string | null
  /** The error's code (not_exported, not_enough_memory, …). */
  errorCode: string | null
  /** How the last answer ended: stop, length or stopped. */
  finish: string | null
  /** Streamed pieces and seconds of the last answer. */
  chunks: number
  seconds: number | null
  /** While `queued`: the GPU session's place in the queue. */
  queuePosition: number | null
}

export type Chat = Record<Side, SideState>

export const emptySide = (): SideState => ({
  messages: [],
  activity: 'idle',
  error: null,
  errorCode: null,
  finish: null,
  chunks: 0,
  seconds: null,
  queuePosition: null,
})

export const emptyChat = (): Chat => ({ tuned: emptySide(), base: emptySide() })

/** The user's message added to each side that will answer, with an empty answer to stream into. */
export function ask(chat: Chat, sides: Side[], text: string): Chat {
  const next = { ...chat }
  for (const side of sides) {
    next[side] = {
      ...emptySide(),
      messages: [...chat[side].messages, { role: 'user', content: text }, { role: 'assistant', content: '' }],
      activity: 'loading',
    }
  }
  return next
}

/** The conversation a side sends: every finished turn and the new question (not the empty answer). */
export function history(side: SideState): ChatMessage[] {
  const messages = side.messages
  const last = messages[messages.length - 1]
  return last && last.role === 'assistant' && last.content === '' ? messages.slice(0, -1) : messages
}

function withAnswer(side: SideState, update: (answer: string) => string): ChatMessage[] {
  const messages = side.messages.slice()
  const last = messages[messages.length - 1]
  if (last && last.role === 'assistant') messages[messages.length - 1] = { ...last, content: update(last.content) }
  else messages.push({ role: 'assistant', content: update('') })
  return messages
}

/** The chat after one message from the server. */
export function receive(chat: Chat, message: ServerMessage): Chat {
  if (message.model == null) return chat // request-wide errors are shown by the page
  const side = chat[message.model]
  switch (message.type) {
    case 'status':
      return {
        ...chat,
        [message.model]: { ...side, activity: message.state, queuePosition: message.queue_position ?? null },
      }
    case 'token':
      return {
        ...chat,
        [message.model]: { ...side, activity: 'generating', messages: withAnswer(side, (text) => text + message.text) },
      }
    case 'done':
      return {
        ...chat,
        [message.model]: {
          ...side,
          activity: 'idle',
          finish: message.finish_reason,
          chunks: message.chunks,
          seconds: message.seconds,
        },
      }
    case 'error':
      return {
        ...chat,
        [message.model]: {
          ...side,
          activity: 'idle',
          error: message.message,
          errorCode: message.code,
          // the question stays, the answer that never came goes
          messages: history(side),
        },
      }
  }
}

export function busy(chat: Chat): boolean {
  return chat.tuned.activity !== 'idle' || chat.base.activity !== 'idle'
}
