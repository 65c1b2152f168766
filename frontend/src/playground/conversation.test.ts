import { describe, expect, it } from 'vitest'
import { ask, busy, emptyChat, history, receive } from './conversation'

describe('playground conversation', () => {
  it('streams tokens into the answer of the side that sent them', () => {
    let chat = ask(emptyChat(), ['base', 'tuned'], 'Hi?')
    expect(busy(chat)).toBe(true)
    expect(history(chat.tuned)).toEqual([{ role: 'user', content: 'Hi?' }])
    chat = receive(chat, { type: 'status', id: 1, model: 'tuned', state: 'generating' })
    chat = receive(chat, { type: 'token', id: 1, model: 'tuned', text: 'Hel' })
    chat = receive(chat, { type: 'token', id: 1, model: 'tuned', text: 'lo' })
    chat = receive(chat, { type: 'token', id: 1, model: 'base', text: 'Yo' })
    expect(chat.tuned.messages.at(-1)).toEqual({ role: 'assistant', content: 'Hello' })
    expect(chat.base.messages.at(-1)).toEqual({ role: 'assistant', content: 'Yo' })
    chat = receive(chat, { type: 'done', id: 1, model: 'tuned', finish_reason: 'stopped', chunks: 2, seconds: 0.5 })
    expect(chat.tuned.activity).toBe('idle')
    expect(chat.tuned.finish).toBe('stopped')
    expect(busy(chat)).toBe(true) // base still answering
    chat = receive(chat, { type: 'done', id: 1, model: 'base', finish_reason: 'stop', chunks: 1, seconds: 0.4 })
    expect(busy(chat)).toBe(false)
    // the next question carries the whole conversation of that side
    const next = ask(chat, ['tuned'], 'And?')
    expect(history(next.tuned).map((m) => m.content)).toEqual(['Hi?', 'Hello', 'And?'])
  })

  it('drops the empty answer of a side that failed and keeps the reason', () => {
    let chat = ask(emptyChat(), ['tuned'], 'Hi?')
    chat = receive(chat, {
      type: 'error',
      id: 1,
      model: 'tuned',
      code: 'not_exported',
      message: 'Job 3 has no GGUF yet: export a GGUF first',
    })
    expect(chat.tuned.messages).toEqual([{ role: 'user', content: 'Hi?' }])
    expect(chat.tuned.error).toContain('export a GGUF first')
    expect(chat.tuned.errorCode).toBe('not_exported')
    expect(busy(chat)).toBe(false)
    // request-wide errors do not touch either side
    expect(receive(chat, { type: 'error', id: 2, model: null, code: 'busy', message: 'busy' })).toBe(chat)
  })
})

describe('playground conversation on a GPU session', () => {
  it('keeps the queue position while the session waits, and drops it when it answers', () => {
    let chat = ask(emptyChat(), ['tuned'], 'Hi?')
    chat = receive(chat, { type: 'status', id: 1, model: 'tuned', state: 'queued', queue_position: 3 })
    expect(chat.tuned.activity).toBe('queued')
    expect(chat.tuned.queuePosition).toBe(3)
    expect(busy(chat)).toBe(true)
    chat = receive(chat, { type: 'status', id: 1, model: 'tuned', state: 'loading' })
    expect(chat.tuned.queuePosition).toBeNull()
  })
})
