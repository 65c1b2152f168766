import { act, render } from '@testing-library/react'
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest'
import {
  BROWSER_NOTIFICATIONS_KEY,
  browserNotificationState,
  jobNotice,
  turnOffBrowserNotifications,
  turnOnBrowserNotifications,
  useJobNotifications,
  type NotificationHost,
} from './notifications'
import { FakeSocket, userFixture } from './test/fixtures'
import type { User } from './types'

function host(permission: NotificationPermission, answer: NotificationPermission = permission) {
  const stored = new Map<string, string>()
  const requestPermission = vi.fn(async () => {
    target.Notification!.permission = answer
    return answer
  })
  const target: NotificationHost = {
    Notification: { permission, requestPermission },
    localStorage: {
      getItem: (key) => stored.get(key) ?? null,
      setItem: (key, value) => void stored.set(key, value),
      removeItem: (key) => void stored.delete(key),
    },
  }
  return { target, requestPermission, stored }
}

describe('browser notification state', () => {
  it('asks the permission only when turned on, and keeps the choice in this browser', async () => {
    const { target, requestPermission, stored } = host('default', 'granted')
    expect(browserNotificationState(target)).toBe('off')
    expect(requestPermission).not.toHaveBeenCalled()
    expect(await turnOnBrowserNotifications(target)).toBe('on')
    expect(stored.get(BROWSER_NOTIFICATIONS_KEY)).toBe('on')
    expect(turnOffBrowserNotifications(target)).toBe('off')
  })

  it('says when the browser refuses or cannot', async () => {
    const { target, stored } = host('default', 'denied')
    expect(await turnOnBrowserNotifications(target)).toBe('denied')
    expect(stored.size).toBe(0)
    expect(browserNotificationState({ localStorage: target.localStorage })).toBe('unsupported')
    const granted = host('granted')
    expect(browserNotificationState(granted.target)).toBe('off') // granted to the site, not chosen here
  })
})

describe('jobNotice', () => {
  const ended = (status: string, extra: Record<string, unknown> = {}) => ({
    type: 'finished', data: { job_id: 7, owner_id: 1, name: 'tiny-lora', status, priority: 0, error: null, ...extra },
  })

  it('tells the owner how their job ended, with its error and its page', () => {
    expect(jobNotice(ended('succeeded'), 1)).toEqual({
      title: 'tiny-lora finished', body: 'Job #7 succeeded.', tag: 'lanner-job-7', path: '/jobs/7',
    })
    expect(jobNotice(ended('failed', { error: 'Out of memory.' }), 1)).toMatchObject({
      title: 'tiny-lora failed', body: 'Out of memory.',
    })
    expect(jobNotice({ type: 'cancelled', data: { job_id: 7, owner_id: 1, name: 'tiny-lora', status: 'cancelled' } }, 1))
      .toMatchObject({ title: 'tiny-lora was cancelled' })
  })

  it('tells the owner why a job just queued waits, once: the added event carries the reason', () => {
    const added = (waiting: string | null, owner = 1) => ({
      type: 'added', data: { job_id: 8, owner_id: owner, name: 'sweep #1', status: 'queued', priority: 0, waiting },
    })
    expect(jobNotice(added('Waiting: the one worker is busy; it runs in its turn.'), 1)).toEqual({
      title: 'sweep #1 is waiting', body: 'Waiting: the one worker is busy; it runs in its turn.',
      tag: 'lanner-job-8', path: '/jobs/8',
    })
    expect(jobNotice(added(null), 1)).toBeNull() // it starts at once, or another run of its sweep told
    expect(jobNotice(added('Waiting: ...', 2), 1)).toBeNull()
  })

  it('ignores other users\' jobs and events that end nothing', () => {
    expect(jobNotice(ended('succeeded'), 2)).toBeNull()
    expect(jobNotice({ type: 'started', data: { job_id: 7, owner_id: 1, status: 'running' } }, 1)).toBeNull()
    expect(jobNotice({ type: 'requeued', data: { job_id: 7, owner_id: 1, status: 'queued' } }, 1)).toBeNull()
  })
})

describe('useJobNotifications', () => {
  const shown: { title: string; options: NotificationOptions }[] = []

  class FakeNotification {
    static permission: NotificationPermission = 'granted'
    static requestPermission = async () => FakeNotification.permission
    onclick: (() => void) | null = null
    constructor(title: string, options: NotificationOptions) {
      shown.push({ title, options })
    }
  }

  function Listener({ user, open }: { user: User; open: (path: string) => void }) {
    useJobNotifications(user, open)
    return null
  }

  beforeEach(() => {
    shown.length = 0
    FakeSocket.instances = []
    vi.stubGlobal('WebSocket', FakeSocket)
    vi.stubGlobal('Notification', FakeNotification)
    window.localStorage.removeItem(BROWSER_NOTIFICATIONS_KEY)
  })
  afterEach(() => {
    vi.unstubAllGlobals()
  })

  it('listens to the queue only once turned on, and shows the end of the user\'s own jobs', async () => {
    vi.useFakeTimers()
    render(<Listener user={userFixture as User} open={() => {}} />)
    expect(FakeSocket.instances).toHaveLength(0)
    await act(async () => {
      await turnOnBrowserNotifications()
    })
    expect(FakeSocket.last.url).toContain('/ws/queue?after=')
    act(() => {
      FakeSocket.last.open()
      FakeSocket.last.receive({ id: '1-0', type: 'finished', data: { job_id: 3, owner_id: userFixture.id, name: 'mine', status: 'failed', error: 'Boom.' } })
      FakeSocket.last.receive({ id: '2-0', type: 'finished', data: { job_id: 4, owner_id: 99, name: 'theirs', status: 'succeeded' } })
      vi.runOnlyPendingTimers()
    })
    expect(shown).toEqual([{ title: 'mine failed', options: { body: 'Boom.', tag: 'lanner-job-3' } }])
    act(() => void turnOffBrowserNotifications())
    expect(FakeSocket.last.closed).toBe(true)
    vi.useRealTimers()
  })
})
