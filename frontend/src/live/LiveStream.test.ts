import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest'
import { UNAUTHORIZED_EVENT } from '../api'
import { FakeSocket } from '../test/fixtures'
import type { StreamEvent } from '../types'
import { LiveStream } from './LiveStream'

beforeEach(() => {
  vi.useFakeTimers()
  FakeSocket.instances = []
})
afterEach(() => {
  vi.useRealTimers()
})

function start(after = '0-0') {
  const received: StreamEvent[] = []
  const states: string[] = []
  const stream = new LiveStream({
    path: '/ws/jobs/7',
    after,
    onEvents: (batch) => received.push(...batch),
    onState: (s) => states.push(s),
    createSocket: (url) => new FakeSocket(url) as unknown as WebSocket,
    backoff: () => 100,
  })
  return { stream, received, states }
}

describe('LiveStream', () => {
  it('reconnects after a drop with the last id it delivered, and never delivers an event twice', async () => {
    const { stream, received, states } = start()
    expect(FakeSocket.last.url).toMatch(/\/ws\/jobs\/7\?after=0-0$/)
    FakeSocket.last.open()
    FakeSocket.last.receive({ id: '1-0', type: 'metric', data: { step: 1 } })
    FakeSocket.last.receive({ id: '2-0', type: 'metric', data: { step: 2 } })
    FakeSocket.last.drop()
    expect(received.map((e) => e.id)).toEqual(['1-0', '2-0'])
    expect(states).toContain('reconnecting')

    await vi.advanceTimersByTimeAsync(100)
    expect(FakeSocket.instances).toHaveLength(2)
    expect(FakeSocket.last.url).toMatch(/after=2-0$/)
    FakeSocket.last.open()
    FakeSocket.last.receive({ id: '2-0', type: 'metric', data: { step: 2 } }) // a repeat
    FakeSocket.last.receive({ id: '3-0', type: 'metric', data: { step: 3 } })
    await vi.advanceTimersByTimeAsync(100)
    expect(received.map((e) => e.id)).toEqual(['1-0', '2-0', '3-0'])
    expect(stream.lastEventId).toBe('3-0')
    stream.close()
    expect(FakeSocket.last.closed).toBe(true)
  })

  it('batches a burst of messages into one delivery', async () => {
    const batches: number[] = []
    new LiveStream({
      path: '/ws/queue', after: '$', onEvents: (b) => batches.push(b.length),
      createSocket: (url) => new FakeSocket(url) as unknown as WebSocket,
    })
    for (let i = 1; i <= 5; i++) FakeSocket.last.receive({ id: `${i}-0`, type: 'added', data: {} })
    await vi.advanceTimersByTimeAsync(60)
    expect(batches).toEqual([5])
  })

  it('stops and asks for sign-in when the server says the session is gone', async () => {
    const listener = vi.fn()
    window.addEventListener(UNAUTHORIZED_EVENT, listener)
    const { states } = start()
    FakeSocket.last.drop(4401, 'Sign in first')
    await vi.advanceTimersByTimeAsync(1000)
    expect(FakeSocket.instances).toHaveLength(1)
    expect(listener).toHaveBeenCalledTimes(1)
    expect(states.at(-1)).toBe('closed')
    window.removeEventListener(UNAUTHORIZED_EVENT, listener)
  })

  it('does not retry a job that does not exist', async () => {
    const { states } = start()
    FakeSocket.last.drop(4404, 'No job 7')
    await vi.advanceTimersByTimeAsync(1000)
    expect(FakeSocket.instances).toHaveLength(1)
    expect(states.at(-1)).toBe('closed')
  })
})
